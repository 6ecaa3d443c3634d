"""What ``save()`` is given is captured at its ``save()``-time value, whatever changes after it:
an EMA model updated after ``save``, a tensor learning rate changed in place by
``scheduler.step()`` after ``save``, BatchNorm statistics changed by the next forward, on the
plain API and on ``save_file`` (DeepSpeed's path). Every checkpoint is compared bit for bit with
a deep copy taken at its ``save``."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptlib
from ckptlib.tests.helpers import assert_same


def _training_state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.BatchNorm1d(512), torch.nn.ReLU(), torch.nn.Linear(512, 1024))
    optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(0.01), foreach=False)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    ema = copy.deepcopy(model)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler, "ema": ema}


def _step(state: dict[str, Any]) -> None:
    model, optimizer = state["model"], state["optimizer"]
    model(torch.randn(16, 64)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()


def _update_after_save(state: dict[str, Any]) -> None:
    lr = state["optimizer"].param_groups[0]["lr"]
    with torch.no_grad():
        for averaged, live in zip(state["ema"].parameters(), state["model"].parameters(), strict=True):
            averaged.mul_(0.9).add_(live, alpha=0.1)
    state["scheduler"].step()
    # The test means something only if the scheduler changes the tensor in place.
    assert state["optimizer"].param_groups[0]["lr"] is lr


def _expected(state: dict[str, Any]) -> dict[str, Any]:
    return {key: copy.deepcopy(value.state_dict()) for key, value in state.items()}


@pytest.mark.slow  # a training process of its own
def test_state_changed_after_save_is_captured_at_its_save_time_value(tmp_path: Path) -> None:
    state = _training_state()
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.002, handle_signals=False)
    expected = {}
    try:
        for step in range(1, 9):
            _step(state)
            expected[step] = _expected(state)
            assert engine.save(state, step=step, capture_rng=False)
            _update_after_save(state)  # before the next optimizer step, as users write it
        engine.wait(persist=True)
        assert engine.committed_steps() == list(range(1, 9))
        for step, values in expected.items():
            loaded = engine.load(step).state
            for key, value in values.items():
                assert_same(value, loaded[key], f"step {step} {key}")
    finally:
        engine.shutdown()


def test_save_file_copies_buffers_and_keeps_only_optimizer_state_live(tmp_path: Path) -> None:
    state = _training_state()
    model, optimizer = state["model"], state["optimizer"]
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.002, handle_signals=False)
    expected = {}
    try:
        engine.watch(optimizer)
        for step in range(1, 7):
            _step(state)
            files = {"optimizer": optimizer.state_dict(), "ema": state["ema"].state_dict(), "module": model.state_dict()}
            expected[step] = copy.deepcopy(files)
            engine.save_file(files, tmp_path / f"step{step}.pt")
            _update_after_save(state)
            model(torch.randn(16, 64))  # a forward before the next step: BatchNorm statistics move
        results = engine.wait(persist=True)
        assert results and all(result.committed for result in results)
        for step, values in expected.items():
            assert_same(values, torch.load(tmp_path / f"step{step}.pt", weights_only=False), f"step {step}")
    finally:
        engine.shutdown()
