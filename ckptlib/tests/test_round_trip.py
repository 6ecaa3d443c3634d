"""A checkpoint reads back bit for bit: model, optimizer, scheduler and RNG state."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

import ckptlib
from ckptlib.tests.helpers import assert_same, small_training_state, snapshot, train_steps


@pytest.mark.slow  # a training process of its own
def test_it_reads_back_model_optimizer_scheduler_exactly(engine: ckptlib.CheckpointEngine) -> None:
    state = small_training_state()
    train_steps(state, 3)
    expected = snapshot(state)

    engine.save(state, step=3)
    [result] = engine.wait(persist=True)

    assert result.committed and result.step == 3 and result.bytes > 0
    fresh = small_training_state(seed=1)
    loaded = engine.load(into=fresh)
    assert loaded.step == 3
    for key in ("model", "optimizer", "scheduler"):
        assert_same(expected[key], loaded.state[key], key)
        assert_same(expected[key], fresh[key].state_dict(), f"live {key}")


def test_it_restores_the_rng_streams(engine: ckptlib.CheckpointEngine) -> None:
    state = small_training_state()
    torch.manual_seed(123), random.seed(7), np.random.seed(9)
    engine.save(state, step=1)
    engine.wait(persist=True)
    expected = (torch.rand(4), random.random(), np.random.rand())

    torch.manual_seed(0), random.seed(0), np.random.seed(0)
    engine.load(1, into={})

    assert torch.equal(torch.rand(4), expected[0])
    assert random.random() == expected[1]
    assert np.random.rand() == expected[2]


def test_the_optimizer_step_right_after_save_does_not_leak_into_the_checkpoint(
    engine: ckptlib.CheckpointEngine,
) -> None:
    state = small_training_state()
    train_steps(state, 2)
    expected = snapshot(state)

    engine.save(state, step=2)
    train_steps(state, 3)  # the next optimizer.step() waits for staging, never for disk
    engine.wait(persist=True)

    loaded = engine.load(2)
    assert_same(expected["model"], loaded.state["model"], "model")
    assert_same(expected["optimizer"], loaded.state["optimizer"], "optimizer")


def test_stock_loaders_read_the_files_under_trainer_names(engine: ckptlib.CheckpointEngine, tmp_path: Path) -> None:
    from safetensors.torch import load_file  # optional (ckptlib reads its files without it): only this test needs it

    state = small_training_state()
    train_steps(state, 1)
    expected = snapshot(state)
    engine.save(state, step=1)
    engine.wait(persist=True)

    directory = tmp_path / "concurrent_checkpoint" / "checkpoint-1"
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "ckptlib.json"} <= {p.name for p in directory.iterdir()}
    assert_same(expected["model"], load_file(directory / "model.safetensors"), "model")
    assert_same(expected["optimizer"], torch.load(directory / "optimizer.pt", weights_only=True), "optimizer")
    assert_same(expected["scheduler"], torch.load(directory / "scheduler.pt", weights_only=True), "scheduler")
    assert json.loads((directory / "ckptlib.json").read_text())["step"] == 1
    assert (tmp_path / "concurrent_checkpoint" / "latest").read_text().strip() == "1"


def test_a_cache_smaller_than_the_state_still_saves_everything(tmp_path: Path) -> None:
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=2e-6, handle_signals=False)
    try:
        state = small_training_state()
        train_steps(state, 1)
        expected = snapshot(state)
        engine.save(state, step=1)
        [result] = engine.wait(persist=True)
        assert result.committed
        assert engine.cache.peak_bytes <= max(engine.cache.limit_bytes, result.bytes)
        assert_same(expected["optimizer"], engine.load(1).state["optimizer"], "optimizer")
    finally:
        engine.shutdown()


def test_latest_step_is_the_newest_commit(engine: ckptlib.CheckpointEngine) -> None:
    state = small_training_state()
    assert engine.latest_step() is None
    for step in (1, 2, 3):
        train_steps(state, 1)
        engine.save(state, step=step)
    engine.wait(persist=True)
    assert engine.latest_step() == 3
    assert engine.committed_steps() == [1, 2, 3]
    with pytest.raises(ckptlib.CheckpointError):
        engine.load(99)


def test_shutdown_leaves_no_writer_thread_running(tmp_path: Path) -> None:
    # A daemon thread still alive when Python finalizes can abort the process at exit.
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, parser_threads=2, handle_signals=False)
    state = small_training_state()
    train_steps(state, 1)
    engine.save(state, step=1)
    engine.shutdown()

    assert engine.latest_step() == 1
    assert not [thread.name for thread in threading.enumerate() if thread.name.startswith("ckptlib-")]
