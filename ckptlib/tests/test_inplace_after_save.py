"""No silently wrong checkpoint: state changed in place after ``save()`` returned never reaches a
committed checkpoint (issue 29's experiment). Each scenario saves 100 times, changing the state
in place right after each ``save()`` (parameters with a ``no_grad`` ``add_``, BatchNorm buffers,
optimizer state, a scheduler step, the EMA swap through ``load_state_dict`` and back, all of them
together), and compares every committed checkpoint bit for bit with a deep copy taken at its
``save()``. The first changed checkpoint is not committed (a warning names the tensor); the later
ones are copied before ``save()`` returns and commit."""

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

SAVES = 100


def _state() -> dict[str, Any]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.BatchNorm1d(256), torch.nn.ReLU(), torch.nn.Linear(256, 256))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.9)
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler}


def _train_step(state: dict[str, Any]) -> None:
    model, optimizer = state["model"], state["optimizer"]
    model(torch.randn(8, 32)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    state["scheduler"].step()


def _parameters(state: dict[str, Any]) -> None:
    with torch.no_grad():
        state["model"][0].weight.add_(1e-3)


def _buffers(state: dict[str, Any]) -> None:
    state["model"][1].running_mean.add_(1e-3)


def _optimizer_state(state: dict[str, Any]) -> None:
    for per_parameter in state["optimizer"].state.values():
        per_parameter["exp_avg"].add_(1e-4)  # small: training stays finite (NaN != NaN)


def _scheduler(state: dict[str, Any]) -> None:
    state["scheduler"].step()


def _ema_swap(state: dict[str, Any]) -> None:
    model = state["model"]
    backup = copy.deepcopy(model.state_dict())
    ema = {key: value * 0.5 for key, value in backup.items()}
    model.load_state_dict(ema)  # copy_: in place
    model.eval()
    with torch.no_grad():
        model(torch.randn(4, 32))
    model.train()
    model.load_state_dict(backup)


def _everything(state: dict[str, Any]) -> None:
    for change in (_parameters, _buffers, _optimizer_state, _scheduler, _ema_swap):
        change(state)


SCENARIOS: dict[str, Callable[[dict[str, Any]], None]] = {
    "parameters": _parameters,
    "buffers": _buffers,
    "optimizer-state": _optimizer_state,
    "scheduler": _scheduler,
    "ema-swap": _ema_swap,
    "all": _everything,
}
# What ``save`` already copies before it returns: a change to it never fails a checkpoint.
COPIED_AT_SAVE = {"buffers", "scheduler"}


def run_experiment(tmp_path: Path, change: Callable[[dict[str, Any]], None] | None, *, copy_mode: str = "checked") -> tuple[int, int, list[str]]:
    """(committed, silently wrong, warnings) over ``SAVES`` saves."""
    state = _state()
    handler = RecordingHandler()
    logging.getLogger("ckptlib").addHandler(handler)
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.05, handle_signals=False, copy_mode=copy_mode)
    expected: dict[int, dict[str, Any]] = {}
    try:
        for step in range(1, SAVES + 1):
            _train_step(state)
            expected[step] = {key: copy.deepcopy(value.state_dict()) for key, value in state.items()}
            assert all(bool(torch.isfinite(p).all()) for p in state["model"].parameters())
            assert engine.save(state, step=step, capture_rng=False)
            if change is not None:
                change(state)
        engine.wait(persist=True)
        wrong = 0
        committed = engine.committed_steps()
        for step in committed:
            loaded = engine.load(step).state
            try:
                for key, value in expected[step].items():
                    assert_same(value, loaded[key], f"step {step} {key}")
            except AssertionError:
                wrong += 1
        return len(committed), wrong, [m for m in handler.messages if "changed in place" in m]
    finally:
        engine.shutdown()
        logging.getLogger("ckptlib").removeHandler(handler)


@pytest.mark.slow  # 100 saves per scenario
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_no_silently_wrong_checkpoint_after_an_in_place_change(tmp_path: Path, scenario: str) -> None:
    committed, wrong, warnings = run_experiment(tmp_path, SCENARIOS[scenario])
    assert wrong == 0, f"{wrong}/{committed} committed checkpoints differ from their save()"
    if scenario in COPIED_AT_SAVE:
        assert committed == SAVES and not warnings
    else:
        # The first changed checkpoint is dropped with a warning naming the tensor; from then
        # on save() copies first, so every later one commits.
        assert SAVES - 2 <= committed < SAVES, committed
        assert warnings and ("model.safetensors: " in warnings[0] or "optimizer.pt: state." in warnings[0])


def test_unchanged_state_commits_every_lazy_checkpoint(tmp_path: Path) -> None:
    committed, wrong, warnings = run_experiment(tmp_path, None)
    assert (committed, wrong, warnings) == (SAVES, 0, [])


def test_eager_mode_commits_every_checkpoint_as_saved(tmp_path: Path) -> None:
    committed, wrong, warnings = run_experiment(tmp_path, _everything, copy_mode="eager")
    assert (committed, wrong, warnings) == (SAVES, 0, [])


def test_copy_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="copy_mode"):
        ckptlib.CheckpointEngine(handle_signals=False, copy_mode="sometimes")
