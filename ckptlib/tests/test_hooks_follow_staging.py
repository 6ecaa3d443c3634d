"""Between checkpoints the model runs without ckptlib's module and gradient hooks.

A registered global forward pre-hook sends every module call through ``torch.nn.Module``'s slow
path, and a post-accumulate-grad hook runs per parameter per backward: a cost at every step,
including the steps that save nothing. Only the optimizer's pre-step hook stays.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
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


CHILD = r"""
import sys, torch, ckptlib
from ckptlib.tests.helpers import small_training_state, train_steps

hooks = torch.nn.modules.module._global_forward_pre_hooks
engine = ckptlib.CheckpointEngine(output_dir=sys.argv[1], host_cache_size=0.1, handle_signals=True)
state = small_training_state()
engine.save(state, step=0)
train_steps(state, 1)
assert len(hooks) == 1, "a plain script's forward hook (its SIGTERM safe point) must stay"
engine.defer_final_checkpoint = True  # an integration that owns the step boundary
assert len(hooks) == 0, "an integration's engine needs no forward hook"
engine.shutdown()
print("ok")
"""


@pytest.mark.slow  # a training process of its own
def test_a_plain_script_keeps_the_forward_hook_as_its_safe_point_for_sigterm(tmp_path: Path) -> None:
    # A child process: handle_signals=True installs a process-wide SIGTERM handler and thread.
    completed = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path)], capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0 and completed.stdout.strip().endswith("ok"), completed.stderr[-3000:]
