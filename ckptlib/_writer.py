"""Writing staged files: safetensors streamed tensor by tensor, ``.pt`` files with ``torch.save``.

Each file is written into the checkpoint's temporary directory and fsynced before its cache
buffers go back to the host cache.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from ckptlib import _format
from ckptlib._plan import FilePlan, Slot
from ckptlib._torchfile import write_streaming


class StagingProgress:
    """Lets a writer wait for the stager, slot by slot, within one checkpoint."""

    def __init__(self) -> None:
        self.cond = threading.Condition()

    def mark_staged(self, plan: FilePlan, count: int) -> None:
        with self.cond:
            plan.staged_count = count
            self.cond.notify_all()

    def wait_staged(self, plan: FilePlan, count: int) -> None:
        with self.cond:
            while plan.staged_count < count:
                self.cond.wait()


def write_file(
    directory: Path,
    plan: FilePlan,
    *,
    progress: StagingProgress,
    release: Callable[[Slot], None],
) -> int:
    """Writes one planned file as its tensors become staged, then fsyncs it.

    Args:
        directory: The checkpoint's temporary directory.
        plan: The file.
        progress: Where the stager reports staged slots.
        release: Gives a slot's cache buffer back once its bytes are written.

    Returns:
        Bytes written.
    """
    path = directory / plan.name
    if plan.tensor_names is not None:
        return _write_safetensors(path, plan, progress=progress, release=release)
    if plan.pickled is not None:
        assert plan.storage_order is not None
        return write_streaming(
            path,
            plan.pickled,
            plan.storage_order,
            plan.slots,
            wait_staged=lambda count: progress.wait_staged(plan, count),
            release=release,
        )
    progress.wait_staged(plan, len(plan.slots))
    with open(path, "wb") as handle:
        torch.save(plan.rebuild(), handle)
        handle.flush()
        os.fsync(handle.fileno())
        written = handle.tell()
    for slot in plan.slots:
        release(slot)
    return written


def _write_safetensors(
    path: Path, plan: FilePlan, *, progress: StagingProgress, release: Callable[[Slot], None]
) -> int:
    assert plan.tensor_names is not None
    entries = []
    for name, slot in zip(plan.tensor_names, plan.slots, strict=True):
        entries.append((name, slot.dtype, slot.shape, slot.nbytes))
    header = _format.safetensors_header(entries)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = _format.write_all(fd, memoryview(header))
        for index, slot in enumerate(plan.slots):
            progress.wait_staged(plan, index + 1)
            assert slot.staged is not None
            if slot.nbytes:
                written += _format.write_all(fd, _bytes_of(slot))
            release(slot)
        os.fsync(fd)
    finally:
        os.close(fd)
    return written


def _bytes_of(slot: Slot) -> memoryview:
    buffer = slot.buffer if slot.buffer is not None else slot.staged.contiguous().view(-1).view(torch.uint8)  # type: ignore[union-attr]
    return memoryview(buffer.numpy())
