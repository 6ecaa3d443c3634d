"""A full disk or an unwritable output dir: a clear error, training goes on, the previous checkpoint stays."""

from __future__ import annotations

import errno
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptlib
from ckptlib import _format
from ckptlib._stage import Stager
from ckptlib.tests.helpers import RecordingHandler, small_training_state, train_steps


@pytest.fixture
def errors() -> Iterator[RecordingHandler]:
    handler = RecordingHandler()
    logger = logging.getLogger("ckptlib")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _one_checkpoint_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errors: RecordingHandler, *, break_it: Any, expected: str) -> None:
    """Step 1 commits; with ``break_it`` applied, step 2 fails with ``expected`` while training
    goes on and step 1 stays the latest; once undone, step 4 commits."""
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=False)
    state = small_training_state()
    try:
        train_steps(state, 1)
        engine.save(state, step=1)
        engine.wait(persist=True)

        break_it()
        train_steps(state, 1)
        assert engine.save(state, step=2)
        train_steps(state, 2)  # training goes on (the staging hooks run inside these steps)
        [result] = engine.wait(persist=True)

        assert not result.committed
        assert expected in (result.error or "")
        assert any("checkpoint step=2 failed" in m and expected in m for m in errors.messages)
        assert engine.latest_step() == 1
        assert engine.load().step == 1
        assert not list(_format.checkpoint_root(tmp_path).glob("*.tmp"))

        monkeypatch.undo()
        engine.save(state, step=4)
        [result] = engine.wait(persist=True)
        assert result.committed and engine.latest_step() == 4
    finally:
        engine.shutdown()


def test_a_full_disk_fails_that_checkpoint_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errors: RecordingHandler) -> None:
    def disk_full(fd: int, buffer: memoryview, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    _one_checkpoint_fails(
        tmp_path, monkeypatch, errors,
        break_it=lambda: monkeypatch.setattr(_format, "write_at", disk_full), expected="No space left on device",
    )  # fmt: skip


def test_a_failure_while_staging_fails_that_checkpoint_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, errors: RecordingHandler) -> None:
    def broken_copy(*args: object, **kwargs: object) -> None:
        raise RuntimeError("copy failed")

    _one_checkpoint_fails(
        tmp_path, monkeypatch, errors,
        break_it=lambda: monkeypatch.setattr(Stager, "_copy", broken_copy), expected="staging failed",
    )  # fmt: skip


def test_an_unwritable_output_dir_is_reported_and_training_goes_on(tmp_path: Path, errors: RecordingHandler) -> None:
    not_a_dir = tmp_path / "a-file"
    not_a_dir.write_text("")
    engine = ckptlib.CheckpointEngine(output_dir=not_a_dir / "out", host_cache_size=0.1, handle_signals=False)
    state = small_training_state()
    try:
        train_steps(state, 1)
        assert engine.save(state, step=1) is False
        train_steps(state, 1)
        [result] = engine.results
        assert not result.committed and "cannot create" in (result.error or "")
        assert any("checkpoint step=1 failed" in m for m in errors.messages)
        assert engine.latest_step() is None
    finally:
        engine.shutdown()


def test_a_state_that_cannot_be_planned_is_reported_not_raised(tmp_path: Path, errors: RecordingHandler) -> None:
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=False)
    state = small_training_state()
    # A module with a tensor safetensors has no code for: planning fails inside save.
    state["model"].register_buffer("odd", torch.zeros(2, dtype=torch.complex64))
    try:
        assert engine.save(state, step=1) is False
        [result] = engine.results
        assert not result.committed and "cannot plan" in (result.error or "")
        assert any("checkpoint step=1 failed" in m for m in errors.messages)
    finally:
        engine.shutdown()
