"""Readers select only whole checkpoints, whatever step of the commit a crash interrupted."""

from __future__ import annotations

from pathlib import Path

import ckptlib
from ckptlib import _format


def _committed(root: Path, step: int) -> Path:
    directory = _format.committed_dir(root, step)
    directory.mkdir(parents=True)
    _format.write_manifest(directory, {"step": step, "keys": {}, "world_size": 1})
    return directory


def test_a_temporary_dir_is_never_selected(tmp_path: Path) -> None:
    root = _format.checkpoint_root(tmp_path)
    _committed(root, 10)
    (root / "latest").write_text("10\n")
    partial = _format.tmp_dir(root, 20)
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    assert ckptlib.read_latest(root) == 10


def test_a_dir_without_manifest_is_not_committed(tmp_path: Path) -> None:
    root = _format.checkpoint_root(tmp_path)
    _committed(root, 10)
    (root / "checkpoint-30").mkdir()
    assert ckptlib.committed_steps(root) == [10]


def test_a_crash_between_rename_and_latest_still_finds_the_new_checkpoint(tmp_path: Path) -> None:
    root = _format.checkpoint_root(tmp_path)
    _committed(root, 10)
    (root / "latest").write_text("10\n")
    _committed(root, 20)
    assert ckptlib.read_latest(root) == 20


def test_a_missing_or_garbled_latest_marker_falls_back_to_listing(tmp_path: Path) -> None:
    root = _format.checkpoint_root(tmp_path)
    _committed(root, 5)
    assert ckptlib.read_latest(root) == 5
    (root / "latest").write_text("garbage")
    assert ckptlib.read_latest(root) == 5


def test_rotation_keeps_the_newest_and_protected_ones(tmp_path: Path) -> None:
    root = _format.checkpoint_root(tmp_path)
    for step in (1, 2, 3, 4):
        _committed(root, step)
    (root / "latest").write_text("4\n")
    _format.tmp_dir(root, 5).mkdir()
    removed = _format.rotate(root, keep=2, protect=[_format.committed_dir(root, 1)])
    assert removed == [2]
    assert ckptlib.committed_steps(root) == [1, 3, 4]
    assert _format.tmp_dir(root, 5).is_dir()


def test_the_commit_line_parses_back() -> None:
    result = ckptlib.CheckpointResult(
        step=120, path="/out/concurrent_checkpoint/checkpoint-120", bytes=123456,
        blocking_s=0.0123, persist_s=1.5, committed=True,
    )  # fmt: skip
    line = f"[2026-07-10 01:50:09,939] [INFO] [_engine.py:1:_complete] {result.log_line()}\n"
    event = ckptlib.parse_commit_line(line)
    assert event == ckptlib.CommitEvent(step=120, bytes=123456, blocking_s=0.0123, persist_s=1.5, path="/out/concurrent_checkpoint/checkpoint-120")
    assert ckptlib.parse_commit_line("[Concurrent Checkpoint] No Checkpoint found with step: -1") is None
