"""A warm start's checkpoint is copied whole, files and directories only: a link in it, or an
entry past the bound, refuses the copy with its reason."""

from __future__ import annotations

import os

import pytest

from agent import inputs


def source(tmp_path):
    top = tmp_path / "checkpoint-20"
    (top / "shards").mkdir(parents=True)
    (top / "ckptlib.json").write_bytes(b"{}")
    (top / "shards" / "model.bin").write_bytes(bytes(range(256)) * 4)
    return top


def copied(top, target):
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        inputs.copy_tree(fd, target)
    finally:
        os.close(fd)


def test_files_and_directories_are_copied_as_they_are(tmp_path):
    top, target = source(tmp_path), tmp_path / "copy"
    target.mkdir()
    copied(top, target)
    assert (target / "shards" / "model.bin").read_bytes() == bytes(range(256)) * 4
    assert (target / "ckptlib.json").stat().st_mode & 0o777 == 0o644


def test_a_link_or_too_many_entries_refuses_the_copy(tmp_path, monkeypatch):
    top = source(tmp_path)
    (top / "leak").symlink_to("/etc/shadow")
    target = tmp_path / "copy"
    target.mkdir()
    with pytest.raises(inputs.InputRefused, match="'leak', which is not a file or a directory"):
        copied(top, target)
    (top / "leak").unlink()
    monkeypatch.setattr(inputs, "MAX_ENTRIES", 2)
    fresh = tmp_path / "again"
    fresh.mkdir()
    with pytest.raises(inputs.InputRefused, match="more than 2 entries"):
        copied(top, fresh)
