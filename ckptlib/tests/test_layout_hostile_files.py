"""The node agent reads a job's checkpoint layout as root: a job that plants a FIFO, a symlink
or a huge file there gets the listing's answer (or none), never a blocked or misled reader."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from ckptlib import checkpoint_root, committed_steps, read_latest
from ckptlib._layout import LATEST_NAME, MANIFEST_NAME, read_small_file


def committed(root: Path, *steps: int) -> None:
    for step in steps:
        directory = root / f"checkpoint-{step}"
        directory.mkdir(parents=True)
        (directory / MANIFEST_NAME).write_text("{}")


def answer_without_blocking(root: Path) -> int | None:
    """read_latest in a thread: a reader blocked in open() would leave the thread alive."""
    result: list[int | None] = []
    reader = threading.Thread(target=lambda: result.append(read_latest(root)), daemon=True)
    reader.start()
    reader.join(timeout=5)
    if reader.is_alive():
        # Unblock the stuck open() so the test process can end, then fail.
        fd = os.open(root / LATEST_NAME, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        pytest.fail("read_latest blocked on the job's `latest`")
    return result[0]


@pytest.mark.slow  # a reader thread, so that a blocked open() fails the test instead of hanging it
def test_a_fifo_latest_marker_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    root = checkpoint_root(tmp_path)
    committed(root, 3, 5)
    os.mkfifo(root / LATEST_NAME)

    assert answer_without_blocking(root) == 5


def test_a_symlinked_latest_marker_is_not_followed(tmp_path: Path) -> None:
    root = checkpoint_root(tmp_path)
    committed(root, 3, 5)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text("3\n")
    (root / LATEST_NAME).symlink_to(elsewhere)

    assert read_latest(root) == 5  # a link to a regular file: nothing to block on
    with pytest.raises(OSError):
        read_small_file(root / LATEST_NAME, 64)


def test_a_huge_latest_marker_is_refused_unread(tmp_path: Path) -> None:
    root = checkpoint_root(tmp_path)
    committed(root, 3, 5)
    (root / LATEST_NAME).write_text("5" + " " * 10_000)

    assert read_latest(root) == 5
    with pytest.raises(OSError, match="more than 64"):
        read_small_file(root / LATEST_NAME, 64)


def test_checkpoints_behind_symlinks_do_not_count(tmp_path: Path) -> None:
    other_job = checkpoint_root(tmp_path / "other-job")
    committed(other_job, 9, 11)
    root = checkpoint_root(tmp_path / "job")
    committed(root, 2)
    (root / "checkpoint-9").symlink_to(other_job / "checkpoint-9")
    (root / "checkpoint-4").mkdir()
    (root / "checkpoint-4" / MANIFEST_NAME).symlink_to(other_job / "checkpoint-11" / MANIFEST_NAME)
    os.mkfifo(root / "checkpoint-6")
    (root / "checkpoint-7").mkdir()
    os.mkfifo(root / "checkpoint-7" / MANIFEST_NAME)
    (root / LATEST_NAME).write_text("9\n")

    assert committed_steps(root) == [2]  # the FIFOs are passed over (a blocked open() would hang here)
    assert read_latest(root) == 2


def test_a_symlinked_checkpoint_root_has_no_checkpoints(tmp_path: Path) -> None:
    other_job = checkpoint_root(tmp_path / "other-job")
    committed(other_job, 9)
    (tmp_path / "job").mkdir()
    root = checkpoint_root(tmp_path / "job")
    root.symlink_to(other_job)

    assert committed_steps(root) == []
    assert read_latest(root) is None
    assert read_latest(other_job) == 9  # the other job's own answer is unaffected


def test_a_fifo_checkpoint_root_has_no_checkpoints(tmp_path: Path) -> None:
    root = checkpoint_root(tmp_path)
    os.mkfifo(root)

    assert committed_steps(root) == []
    assert read_latest(root) is None


def test_a_well_formed_layout_still_answers_its_marker(tmp_path: Path) -> None:
    root = checkpoint_root(tmp_path)
    committed(root, 3, 5)
    (root / LATEST_NAME).write_text("5\n")
    (root / "checkpoint-7.tmp").mkdir()

    assert committed_steps(root) == [3, 5]
    assert read_latest(root) == 5
    assert read_latest(tmp_path / "missing") is None


def test_reading_the_layout_leaves_no_descriptor_open(tmp_path: Path) -> None:
    root = checkpoint_root(tmp_path)
    committed(root, 3, 5)
    os.mkfifo(root / LATEST_NAME)
    before = len(os.listdir("/proc/self/fd"))

    for _ in range(20):
        assert read_latest(root) == 5 and committed_steps(root) == [3, 5]

    assert len(os.listdir("/proc/self/fd")) == before
