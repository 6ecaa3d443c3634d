"""Between checkpoints the model runs without ckptlib's module and gradient hooks.

A registered global forward pre-hook sends every module call through ``torch.nn.Module``'s slow
path, and a post-accumulate-grad hook runs per parameter per backward: a cost at every step,
including the steps that save nothing. Only the optimizer's pre-step hook stays.
"""

from __future__ import annotations

from pathlib import Path

import torch

import ckptlib
from ckptlib.tests.helpers import assert_same, small_training_state, snapshot, train_steps


def _module_hooks() -> int:
    return len(torch.nn.modules.module._global_forward_pre_hooks)


def _gradient_hooks(model: torch.nn.Module) -> int:
    return sum(len(getattr(p, "_post_accumulate_grad_hooks", None) or {}) for p in model.parameters())


def test_no_module_or_gradient_hook_runs_between_checkpoints_and_saves_stay_exact(tmp_path: Path) -> None:
    before = _module_hooks()
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=False)
    try:
        state = small_training_state()
        train_steps(state, 2)
        for step in (2, 4, 6):
            expected = snapshot(state)
            engine.save(state, step=step)
            train_steps(state, 2)  # the first step's pre-step hook ends staging
            assert _module_hooks() == before
            assert _gradient_hooks(state["model"]) == 0
        results = engine.wait(persist=True)
        assert [r.committed for r in results] == [True, True, True]
        loaded = engine.load(6)
        for key in ("model", "optimizer", "scheduler"):
            assert_same(expected[key], loaded.state[key], key)
    finally:
        engine.shutdown()


def test_a_plain_script_keeps_the_forward_hook_as_its_safe_point_for_sigterm(tmp_path: Path) -> None:
    before = _module_hooks()
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=True)
    try:
        state = small_training_state()
        engine.save(state, step=0)
        train_steps(state, 1)
        assert _module_hooks() == before + 1
        engine.defer_final_checkpoint = True  # an integration that owns the step boundary
        assert _module_hooks() == before
    finally:
        engine.shutdown()
    assert _module_hooks() == before
