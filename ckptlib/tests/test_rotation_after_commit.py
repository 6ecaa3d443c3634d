"""``save_total_limit=1`` under DeepSpeed: the Trainer's own rotation would delete the last
committed checkpoint before the new one commits; a crash in that window must still resume."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

import ckptlib._format as _format
from ckptlib._trainer import DecoratedCheckpointing, deepspeed_committed_steps


def _decorator(output_dir: Path) -> DecoratedCheckpointing:
    decorator = DecoratedCheckpointing.__new__(DecoratedCheckpointing)
    decorator.trainer = SimpleNamespace(
        args=SimpleNamespace(save_total_limit=1, should_save=True, output_dir=str(output_dir)),
        state=SimpleNamespace(best_model_checkpoint=None),
    )
    return decorator


def _trainers_own_save(output_dir: Path, step: int, args: SimpleNamespace) -> None:
    """What Trainer._save_checkpoint does under DeepSpeed: write, then rotate at once."""
    from transformers.trainer_utils import rotate_checkpoints  # lazy: transformers is optional

    (output_dir / f"checkpoint-{step}" / f"global_step{step}").mkdir(parents=True)
    rotate_checkpoints(output_dir=str(output_dir), save_total_limit=args.save_total_limit, use_mtime=False)


def test_a_crash_between_save_and_commit_still_resumes_the_last_committed_checkpoint(tmp_path: Path) -> None:
    decorator = _decorator(tmp_path)
    args = decorator.trainer.args
    (tmp_path / "checkpoint-2" / "global_step2").mkdir(parents=True)
    (tmp_path / "checkpoint-2" / "latest").write_text("global_step2")  # committed
    save = decorator._save_checkpoint_rotating_after_commit(lambda model, trial: _trainers_own_save(tmp_path, 4, args))
    save(None, None)
    # "crash" here: checkpoint-4 has no `latest` yet (DeepSpeed writes it at the next step).
    assert args.save_total_limit == 1
    assert deepspeed_committed_steps(tmp_path) == [2]

    (tmp_path / "checkpoint-4" / "latest").write_text("global_step4")  # the next step committed it
    save = decorator._save_checkpoint_rotating_after_commit(lambda model, trial: _trainers_own_save(tmp_path, 6, args))
    save(None, None)
    assert deepspeed_committed_steps(tmp_path) == [4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4", "checkpoint-6"]


def test_a_commit_that_fails_after_the_rename_leaves_nothing_selectable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "concurrent_checkpoint"
    source = _format.tmp_dir(root, 5)
    source.mkdir(parents=True)
    _format.write_manifest(source, {"step": 5})

    def full_disk(path: Path, payload: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_format, "write_bytes_durably", full_disk)
    with pytest.raises(OSError):
        _format.commit(root, 5)
    assert _format.committed_steps(root) == [] and _format.read_latest(root) is None
    assert source.is_dir()  # the caller removes it (or the next start does)
