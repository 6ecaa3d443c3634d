"""Staging: copying a checkpoint's bytes, in file order, into host-cache chunks for the writers.

Staging runs on the training thread, in small steps, at points where training is between two
operations: the start of each module's forward, each parameter's gradient accumulation in
backward (``CheckpointEngine`` installs those hooks), ``save`` itself, and the optimizer's
pre-step hook. Between operations the copy uses torch's own parallel copy on the training
thread's cores; a separate copying thread would take a core away from the training thread's
parallel regions in the middle of an operation, which on a busy machine costs the step several
times the copy's own time.

At the ordinary points (``run(force=False)``) staging keeps only ``window_bytes`` of chunks ahead
of the writers, so the cache holds a few chunks while the disk keeps up. At the optimizer's
pre-step hook (``run(force=True)``) everything left is copied, into as many chunks as the cache
bound allows, waiting for the writers when it is full: parameters and optimizer state are about to
change.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ckptlib._cache import Chunk, HostCache
from ckptlib._plan import FilePlan, Slot
from ckptlib._writer import FileSink


@dataclass(frozen=True)
class WriteItem:
    """A chunk for a writer, or (``chunk`` None) the end of a file after ``index`` chunks.

    ``ready`` (CUDA) is recorded after the chunk's copies; the writer waits for it.
    """

    job: Any
    sink: FileSink
    chunk: Chunk | None
    index: int
    length: int
    ready: Any = None


@dataclass(eq=False)
class _Cursor:
    """Where staging of one checkpoint stands."""

    job: Any
    file_index: int = 0
    piece_index: int = 0
    piece_offset: int = 0
    sink: FileSink | None = None
    chunk: Chunk | None = None
    used: int = 0
    handed: int = 0
    sources: dict[int, torch.Tensor] = field(default_factory=dict)


class Stager:
    """Stages checkpoints in the order they were saved.

    Args:
        cache: The host cache chunks come from.
        window_bytes: Chunks in use beyond which ordinary points stop staging.
        hand_over: Gives a ``WriteItem`` to the writers.
    """

    def __init__(self, cache: HostCache, *, window_bytes: int, hand_over: Any) -> None:
        self.cache = cache
        self.window_bytes = window_bytes
        self._hand_over = hand_over
        self._stream = torch.cuda.Stream() if torch.cuda.is_available() else None
        self._lock = threading.Lock()
        self._cursors: list[_Cursor] = []
        self.last_run = time.monotonic()

    @property
    def idle(self) -> bool:
        return not self._cursors

    def add(self, job: Any) -> None:
        with self._lock:
            self._cursors.append(_Cursor(job))

    def run(self, *, force: bool) -> bool:
        """Stages what it may now. Returns whether it did anything.

        With ``force`` it returns only once every checkpoint in flight is staged; without, it
        returns at once when another thread is staging or the window is full.
        """
        if not self._cursors:
            return False
        if not self._lock.acquire(blocking=force):
            return False
        self.last_run = time.monotonic()
        try:
            while self._cursors:
                cursor = self._cursors[0]
                if not self._advance(cursor, force=force):
                    break
                self._cursors.pop(0)
                cursor.job.staged.set()
            return True
        finally:
            self.last_run = time.monotonic()
            self._lock.release()

    def _advance(self, cursor: _Cursor, *, force: bool) -> bool:
        """Copies the job's next bytes; True once all of them are handed over."""
        job = cursor.job
        files: list[FilePlan] = job.plan.files
        while cursor.file_index < len(files):
            plan = files[cursor.file_index]
            if cursor.sink is None:
                cursor.sink = FileSink(job.directory / plan.name, size=plan.size, chunk_bytes=self.cache.chunk_bytes)
            while job.error is None and cursor.piece_index < len(plan.pieces):
                piece = plan.pieces[cursor.piece_index]
                if isinstance(piece, bytes):
                    source, start, length = piece, 0, len(piece)
                else:
                    slot_index, start, length = piece
                    source = cursor.sources.get(slot_index)
                    if source is None:
                        source = cursor.sources[slot_index] = _byte_view(plan.slots[slot_index])
                while job.error is None and cursor.piece_offset < length:
                    if cursor.chunk is None:
                        chunk = self._next_chunk(job, force=force)
                        if chunk is None:
                            if job.error is None:
                                return False
                            break
                        cursor.chunk, cursor.used = chunk, 0
                    take = min(length - cursor.piece_offset, cursor.chunk.size - cursor.used)
                    self._copy(cursor.chunk, cursor.used, source, start + cursor.piece_offset, take)
                    cursor.used += take
                    cursor.piece_offset += take
                    if cursor.used == cursor.chunk.size:
                        self._send(cursor)
                if job.error is None:
                    cursor.piece_index += 1
                    cursor.piece_offset = 0
            # The file is staged (or its checkpoint failed): the last chunk, then its end.
            if cursor.chunk is not None:
                if job.error is None:
                    self._send(cursor)
                else:
                    self.cache.release(cursor.chunk, keep_bytes=self.window_bytes)
                    cursor.chunk = None
            self._hand_over(WriteItem(job, cursor.sink, None, cursor.handed, 0))
            for slot in plan.slots:
                slot.source = None
            cursor.sources.clear()
            cursor.file_index += 1
            cursor.piece_index = cursor.piece_offset = cursor.handed = 0
            cursor.sink = None
        return True

    def _next_chunk(self, job: Any, *, force: bool) -> Chunk | None:
        if not force:
            if self.cache.in_use_bytes >= self.window_bytes:
                return None
            return self.cache.acquire(timeout=0)
        while job.error is None:
            chunk = self.cache.acquire(timeout=0.1)
            if chunk is not None:
                return chunk
        return None

    def _copy(self, chunk: Chunk, offset: int, source: bytes | torch.Tensor, start: int, length: int) -> None:
        if isinstance(source, bytes):
            chunk.array[offset : offset + length] = np.frombuffer(source, dtype=np.uint8, count=length, offset=start)
        elif source.device.type == "cpu":
            chunk.tensor[offset : offset + length].copy_(source[start : start + length])
        else:
            with torch.cuda.stream(self._stream):
                chunk.tensor[offset : offset + length].copy_(source[start : start + length], non_blocking=True)

    def _send(self, cursor: _Cursor) -> None:
        assert cursor.chunk is not None and cursor.sink is not None
        ready = None
        if self._stream is not None:
            ready = torch.cuda.Event()
            ready.record(self._stream)
        self._hand_over(WriteItem(cursor.job, cursor.sink, cursor.chunk, cursor.handed, cursor.used, ready))
        cursor.handed += 1
        cursor.chunk = None


def _byte_view(slot: Slot) -> torch.Tensor:
    """The slot's bytes as a flat ``uint8`` tensor (on the slot's device)."""
    assert slot.source is not None
    tensor = slot.source.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)
