"""A state saved again and again (per-step snapshots) reuses its pickled skeleton only while
nothing but tensor bytes changed: a changed learning rate, a resized or shared state tensor and a
changed RNG state are all read back as they were at each save."""

from __future__ import annotations

import copy
import random
from typing import Any

import torch

import ckptlib
from ckptlib.tests.helpers import assert_same, small_training_state, train_steps


def _saved(engine: ckptlib.CheckpointEngine, state: dict[str, Any], step: int) -> dict[str, Any]:
    expected = copy.deepcopy(state["optimizer"].state_dict())
    python_rng = random.getstate()
    engine.save(state, step=step)
    [result] = engine.wait(persist=True)
    assert result.committed
    loaded = engine.load(step).state
    assert loaded["rng_state"]["python"] == python_rng
    assert_same(expected, loaded["optimizer"], f"optimizer at step {step}")
    return loaded


def test_each_save_reads_back_what_the_state_held_when_it_was_saved(engine: ckptlib.CheckpointEngine) -> None:
    state = small_training_state()
    optimizer = state["optimizer"]
    train_steps(state, 1)
    _saved(engine, state, 1)
    train_steps(state, 1)
    _saved(engine, state, 2)  # only tensor bytes changed

    optimizer.param_groups[0]["lr"] = 0.125
    random.random()
    _saved(engine, state, 3)

    first = optimizer.state[optimizer.param_groups[0]["params"][0]]
    first["exp_avg"] = torch.zeros(first["exp_avg"].numel() + 3)
    _saved(engine, state, 4)

    first["exp_avg"] = first["exp_avg_sq"]  # two entries, one tensor
    loaded = _saved(engine, state, 5)
    entry = loaded["optimizer"]["state"][0]
    assert entry["exp_avg"].untyped_storage().data_ptr() == entry["exp_avg_sq"].untyped_storage().data_ptr()

    first["exp_avg"] = first["exp_avg_sq"].clone()  # equal values, separate again
    loaded = _saved(engine, state, 6)
    entry = loaded["optimizer"]["state"][0]
    assert entry["exp_avg"].untyped_storage().data_ptr() != entry["exp_avg_sq"].untyped_storage().data_ptr()
