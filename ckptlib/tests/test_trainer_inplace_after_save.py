"""The Trainer path of issue 29's experiment: a callback changes a parameter in place right after
each of 100 saves (``on_save``, before the next optimizer step). No committed checkpoint differs
from the model as it was at its save."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch

from ckptlib._reader import read_safetensors
from ckptlib.tests.test_trainer_integration import _decorate, _trainer

pytest.importorskip("transformers")

SAVES = 100


@pytest.mark.slow  # 100 Trainer checkpoints
def test_a_change_after_the_trainers_save_never_reaches_a_committed_checkpoint(offline_assets: dict[str, str], tmp_path: Path) -> None:
    from transformers import TrainerCallback

    expected: dict[int, dict[str, torch.Tensor]] = {}

    class ChangeAfterSave(TrainerCallback):
        def on_save(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            expected[state.global_step] = copy.deepcopy(model.state_dict())
            with torch.no_grad():
                next(model.parameters()).add_(1e-3)

    trainer = _trainer(offline_assets, tmp_path, max_steps=SAVES, save_steps=1)
    trainer.add_callback(ChangeAfterSave())
    decorator = _decorate(trainer)
    trainer.train()
    # train() returns once the last save is staged; its files may still be persisting. Counted
    # before they finish, a loaded machine showed 66 of 100, and the engine's threads went on
    # committing (and logging) into the next test.
    decorator.shutdown()
    committed = decorator.engine.committed_steps()
    wrong = []
    for step in committed:
        saved = read_safetensors(decorator.engine.root / f"checkpoint-{step}" / "model.safetensors")
        if any(not torch.equal(expected[step][name], tensor) for name, tensor in saved.items()):
            wrong.append(step)
    assert wrong == [], f"{len(wrong)}/{len(committed)} committed checkpoints differ from their save"
    # The first save changed before its copy is dropped (from then on save() copies before it
    # returns); every later one commits: 99 of 100.
    assert len(committed) >= SAVES - 1, committed
