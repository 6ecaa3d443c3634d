"""Verify before resume: a damaged newest checkpoint (a truncated or empty ``model.safetensors``
or ``optimizer.pt``, a broken manifest) is skipped with a warning naming the file; the previous
one is chosen and loads bit-exact. A checkpoint of another shape changes neither the model nor
the optimizer."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptlib
from ckptlib.tests.helpers import RecordingHandler, assert_same


def _state(width: int = 64) -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, width), torch.nn.ReLU(), torch.nn.Linear(width, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return {"model": model, "optimizer": optimizer}


def _step(state: dict[str, Any]) -> None:
    state["model"](torch.randn(8, 16)).pow(2).mean().backward()
    state["optimizer"].step()
    state["optimizer"].zero_grad()


def _three_checkpoints(tmp_path: Path) -> tuple[ckptlib.CheckpointEngine, dict[int, dict[str, Any]]]:
    state = _state()
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.05, handle_signals=False)
    expected = {}
    for step in (1, 2, 3):
        _step(state)
        expected[step] = {key: copy.deepcopy(value.state_dict()) for key, value in state.items()}
        engine.save(state, step=step, capture_rng=False)
        engine.wait(persist=True)
    return engine, expected


DAMAGE: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "truncated-model": ("model.safetensors", lambda data: data[: len(data) // 2]),
    "empty-model": ("model.safetensors", lambda data: b""),
    "truncated-optimizer": ("optimizer.pt", lambda data: data[: len(data) - 100]),
    "empty-optimizer": ("optimizer.pt", lambda data: b""),
    "flipped-optimizer-byte": ("optimizer.pt", lambda data: data[:-1] + bytes([data[-1] ^ 1])),
    "empty-manifest": ("ckptlib.json", lambda data: b""),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_skipped_and_the_previous_one_loads(tmp_path: Path, damage: str) -> None:
    engine, expected = _three_checkpoints(tmp_path)
    handler = RecordingHandler()
    logging.getLogger("ckptlib").addHandler(handler)
    try:
        name, change = DAMAGE[damage]
        path = engine.root / "checkpoint-3" / name
        path.write_bytes(change(path.read_bytes()))
        assert engine.latest_step() == 2
        assert engine.committed_steps() == [1, 2]
        assert ckptlib.read_latest(engine.root) == 2  # what the platform's CKPT_LAST_STEP reads
        assert any(f"checkpoint-3/{name}" in message for message in handler.messages), handler.messages
        target = _state()
        loaded = engine.load(into=target)
        assert loaded.step == 2
        for key, value in expected[2].items():
            assert_same(value, target[key].state_dict(), key)
        with pytest.raises(ckptlib.CheckpointError, match=f"checkpoint-3/{name}"):
            engine.load(3)
    finally:
        logging.getLogger("ckptlib").removeHandler(handler)
        engine.shutdown()


def test_a_checkpoint_of_another_shape_changes_nothing(tmp_path: Path) -> None:
    engine, _ = _three_checkpoints(tmp_path)
    try:
        other = _state(width=32)
        _step(other)
        # The optimizer first: nothing may be loaded before every key is checked.
        target = {"optimizer": other["optimizer"], "model": other["model"]}
        before = {key: copy.deepcopy(value.state_dict()) for key, value in target.items()}
        with pytest.raises(ckptlib.CheckpointError, match="shape"):
            engine.load(into=target)
        for key, value in before.items():
            assert_same(value, target[key].state_dict(), key)
        _step(other)  # still trains
    finally:
        engine.shutdown()


@pytest.mark.parametrize("field", ["keys", "step", "world_size"])
def test_a_manifest_without_a_field_it_needs_is_a_checkpoint_error_naming_it(tmp_path: Path, field: str) -> None:
    import json

    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.05, handle_signals=False)
    try:
        state = _state()
        engine.save(state, step=1, capture_rng=field == "world_size")
        engine.wait(persist=True)
        manifest = engine.root / "checkpoint-1" / "ckptlib.json"
        record = json.loads(manifest.read_text())
        del record[field]
        manifest.write_text(json.dumps(record))
        with pytest.raises(ckptlib.CheckpointError, match=f"ckptlib.json.*{field}"):
            engine.load(1)
    finally:
        engine.shutdown()
