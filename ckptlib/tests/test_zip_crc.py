"""The optimizer.pt that ckptlib streams carries real CRC-32s: ``zipfile.testzip`` accepts it,
catches a flipped byte in a storage, and ``torch.load`` reads it back exactly."""

from __future__ import annotations

import os
import zipfile
import zlib
from pathlib import Path

import torch

import ckptlib
from ckptlib._zipcrc import crc32_combine
from ckptlib.tests.helpers import small_training_state, train_steps


def test_crc32_combine_matches_zlib() -> None:
    for length in (0, 1, 7, 4096, 65_537):
        first, second = os.urandom(1000), os.urandom(length)
        assert crc32_combine(zlib.crc32(first), zlib.crc32(second), length) == zlib.crc32(first + second)


def _optimizer_file(tmp_path: Path) -> Path:
    [found] = [p for p in tmp_path.rglob("optimizer.pt") if ".ckptlib-tmp" not in p.name]
    return found


def test_the_streamed_optimizer_file_has_real_crcs_and_loads(engine: ckptlib.CheckpointEngine, tmp_path: Path) -> None:
    state = small_training_state()
    train_steps(state, 2)
    expected = {k: v.clone() for k, v in state["optimizer"].state_dict()["state"][0].items()}
    engine.save(state, step=2)
    [result] = engine.wait(persist=True)
    assert result.committed
    path = _optimizer_file(tmp_path)

    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() is None
        storages = [info for info in archive.infolist() if "/data/" in info.filename]
        assert storages and all(info.CRC != 0 for info in storages if info.file_size)
    loaded = torch.load(path, weights_only=True)
    for key, value in expected.items():
        assert torch.equal(loaded["state"][0][key], value), key

    # A flipped byte inside a storage record is caught by its CRC.
    with zipfile.ZipFile(path) as archive:
        info = max(storages, key=lambda i: i.file_size)
        with archive.open(info) as member:
            member.read(1)
            start = member._fileobj.tell() - 1  # type: ignore[attr-defined]
    with path.open("r+b") as handle:
        handle.seek(start)
        byte = handle.read(1)
        handle.seek(start)
        handle.write(bytes([byte[0] ^ 0xFF]))
    with zipfile.ZipFile(path) as archive:
        assert archive.testzip() == info.filename
