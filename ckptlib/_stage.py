"""Staging: turning a checkpoint's bytes, in file order, into write items for the writers.

Each file's bytes become page-aligned ranges, each either

* **live**: a range of a CPU tensor that is page-aligned both in memory and in the file (large
  tensors are, when torch allocates them page-aligned: ``THP_MEM_ALLOC_ENABLE=1``, which the
  console sets for every job). The writer sends it to the disk straight from the tensor; nothing
  is copied. Parameters and optimizer state do not change until the next optimizer step, so this
  is valid until then; or
* **staged**: copied into a host-cache chunk (everything else: headers, small or unaligned
  tensors, tensors on a device).

Staging runs on the training thread, in small steps, at points where training is between two
operations: the start of each module's forward, each parameter's gradient accumulation in
backward (``CheckpointEngine`` installs those hooks), ``save`` itself, and the optimizer's
pre-step hook. Between operations the copy uses torch's own parallel copy on the training
thread's cores; a separate copying thread would take a core away from the training thread's
parallel regions in the middle of an operation, which on a busy machine costs the step several
times the copy's own time. When training reaches none of those points for a while (it saved and
went on to something else), the writers stage in its place.

At ordinary points (``run(force=False)``) staging keeps only ``window_bytes`` of chunks ahead of
the writers. At the optimizer's pre-step hook (``run(force=True)``) everything left is copied,
into as many chunks as the cache bound allows, waiting for the writers when it is full; live
ranges not yet written are revoked and copied too, and one being written is waited for:
parameters and optimizer state are about to change.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ckptlib._cache import PAGE, Chunk, HostCache
from ckptlib._plan import FilePlan, Slot
from ckptlib._writer import DONE, QUEUED, REVOKED, WRITING, FileSink, WriteItem

# Live ranges smaller than this are copied: a direct write has a fixed cost.
_MIN_LIVE = 1 << 20


@dataclass(eq=False)
class _Cursor:
    """Where staging of one checkpoint stands."""

    job: Any
    file_index: int = 0
    piece_index: int = 0
    piece_offset: int = 0
    file_pos: int = 0
    sink: FileSink | None = None
    chunk: Chunk | None = None
    chunk_offset: int = 0
    used: int = 0
    sources: dict[int, torch.Tensor] = field(default_factory=dict)
    live: list[WriteItem] = field(default_factory=list)
    copied: bool = False
    allow_live: bool = True


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
        self._items_lock = threading.Lock()
        self._cursors: list[_Cursor] = []
        self.last_run = time.monotonic()
        self.copied_bytes = 0
        self.live_bytes = 0

    @property
    def idle(self) -> bool:
        return not self._cursors

    def add(self, job: Any, *, live: bool) -> None:
        """Queues a checkpoint; ``live``: its tensors stay unchanged until ``run(force=True)``."""
        with self._lock:
            self._cursors.append(_Cursor(job, allow_live=live))

    def run(self, *, force: bool) -> bool:
        """Stages what it may now. Returns whether it did anything.

        With ``force`` it returns only once every checkpoint in flight is staged (no live range
        left to write); without, it returns at once when another thread is staging or the window
        is full.
        """
        if not self._cursors:
            return False
        if not self._lock.acquire(blocking=force):
            return False
        self.last_run = time.monotonic()
        try:
            while self._cursors:
                cursor = self._cursors[0]
                try:
                    if not cursor.copied:
                        cursor.copied = self._advance(cursor, force=force)
                        if not cursor.copied:
                            break
                    if force:
                        self._take_back_live(cursor)
                    elif any(item.state in (QUEUED, WRITING) for item in cursor.live):
                        break
                except Exception as error:  # noqa: BLE001 - staging runs inside training: never raise there
                    self._abandon(cursor, f"staging failed: {error!r}")
                cursor.live.clear()
                self._cursors.pop(0)
                cursor.job.staged.set()
            return True
        finally:
            self.last_run = time.monotonic()
            self._lock.release()

    def _abandon(self, cursor: _Cursor, message: str) -> None:
        """Fails the checkpoint and hands over the rest of its files as ends, without copying."""
        cursor.job.fail_in_flight(message)
        if not cursor.copied:
            cursor.copied = self._advance(cursor, force=True)
        self._take_back_live(cursor)  # with the error set: revokes without copying

    def begin_live_write(self, item: WriteItem) -> bool:
        """Called by a writer before writing a live item: False if it was revoked."""
        with self._items_lock:
            if item.state != QUEUED:
                return False
            item.state = WRITING
            return True

    def end_live_write(self, item: WriteItem) -> None:
        with self._items_lock:
            if item.state == WRITING:
                item.state = DONE
        item.finished.set()

    # ---- copying ----------------------------------------------------------------------------

    def _advance(self, cursor: _Cursor, *, force: bool) -> bool:
        """Hands over the job's next bytes; True once all of them are handed over."""
        job = cursor.job
        files: list[FilePlan] = job.plan.files
        while cursor.file_index < len(files):
            plan = files[cursor.file_index]
            if cursor.sink is None:
                cursor.sink = FileSink(job.directory / plan.name, size=plan.size)
            while job.error is None and cursor.piece_index < len(plan.pieces):
                piece = plan.pieces[cursor.piece_index]
                if isinstance(piece, bytes):
                    source, start, length = piece, 0, len(piece)
                    live_ok = False
                else:
                    slot_index, start, length = piece
                    source = cursor.sources.get(slot_index)
                    if source is None:
                        source = cursor.sources[slot_index] = _byte_view(plan.slots[slot_index])
                    live_ok = cursor.allow_live and _can_write_live(
                        source, start + cursor.piece_offset, cursor.file_pos, length - cursor.piece_offset
                    )
                while job.error is None and cursor.piece_offset < length:
                    left = length - cursor.piece_offset
                    if live_ok and cursor.file_pos % PAGE == 0:
                        self._send_live(cursor, source, start + cursor.piece_offset, left // PAGE * PAGE)
                        live_ok = False
                        continue
                    if cursor.chunk is None:
                        chunk = self._next_chunk(job, force=force)
                        if chunk is None:
                            if job.error is None:
                                return False
                            break
                        cursor.chunk, cursor.used, cursor.chunk_offset = chunk, 0, cursor.file_pos
                    take = min(left, cursor.chunk.size - cursor.used)
                    if live_ok:  # copy only up to the page boundary where the live range starts
                        take = min(take, -cursor.file_pos % PAGE)
                    self._copy(cursor.chunk, cursor.used, source, start + cursor.piece_offset, take)
                    cursor.used += take
                    cursor.piece_offset += take
                    cursor.file_pos += take
                    if cursor.used == cursor.chunk.size:
                        self._send_chunk(cursor)
                if job.error is None:
                    cursor.piece_index += 1
                    cursor.piece_offset = 0
            # The file is handed over (or its checkpoint failed): the last chunk, then its end.
            if cursor.chunk is not None:
                if job.error is None:
                    self._send_chunk(cursor)
                else:
                    self.cache.release(cursor.chunk, keep_bytes=self.window_bytes)
                    cursor.chunk = None
            self._hand_over(WriteItem(job, cursor.sink, end=True))
            # Live items keep their own views; the plan lets go of the tensors.
            for slot in plan.slots:
                slot.source = None
            cursor.sources.clear()
            cursor.file_index += 1
            cursor.piece_index = cursor.piece_offset = cursor.file_pos = 0
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
        self.copied_bytes += length

    def _send_chunk(self, cursor: _Cursor) -> None:
        assert cursor.chunk is not None and cursor.sink is not None
        ready = None
        if self._stream is not None:
            ready = torch.cuda.Event()
            ready.record(self._stream)
        cursor.sink.reserve()
        self._hand_over(
            WriteItem(cursor.job, cursor.sink, cursor.chunk_offset, cursor.used, chunk=cursor.chunk, ready=ready)
        )
        cursor.chunk = None

    def _send_live(self, cursor: _Cursor, source: torch.Tensor, start: int, length: int) -> None:
        """Hands over a page-aligned range of a live tensor, ending the current chunk first."""
        if cursor.chunk is not None:
            self._send_chunk(cursor)
        assert cursor.sink is not None
        item = WriteItem(cursor.job, cursor.sink, cursor.file_pos, length, live=source[start : start + length])
        cursor.live.append(item)
        cursor.sink.reserve()
        self._hand_over(item)
        cursor.piece_offset += length
        cursor.file_pos += length
        self.live_bytes += length

    def _take_back_live(self, cursor: _Cursor) -> None:
        """Before the optimizer step: copies the live ranges not yet written, waits for the rest."""
        for item in cursor.live:
            with self._items_lock:
                revoke = item.state == QUEUED
                if revoke:
                    item.state = REVOKED
                    item.sink.reserve()  # held until the copies are handed over
            if revoke:
                if cursor.job.error is None:
                    self._copy_revoked(cursor, item)
                    self.live_bytes -= item.length
                self._hand_over(WriteItem(cursor.job, item.sink))  # releases the reservation
            else:
                item.finished.wait()

    def _copy_revoked(self, cursor: _Cursor, item: WriteItem) -> None:
        done = 0
        while done < item.length and cursor.job.error is None:
            chunk = self._next_chunk(cursor.job, force=True)
            if chunk is None:
                return
            take = min(chunk.size, item.length - done)
            self._copy(chunk, 0, item.live, done, take)
            item.sink.reserve()
            self._hand_over(WriteItem(cursor.job, item.sink, item.offset + done, take, chunk=chunk))
            done += take


def _can_write_live(source: Any, start: int, file_pos: int, length: int) -> bool:
    """Whether part of this range can be written straight from memory: a CPU tensor whose memory
    and file positions are page-aligned together, with at least ``_MIN_LIVE`` bytes past the
    first common page boundary."""
    if isinstance(source, bytes) or source.device.type != "cpu":
        return False
    address = source.data_ptr() + start
    if (address - file_pos) % PAGE:
        return False
    return length - (-file_pos % PAGE) >= _MIN_LIVE


def _byte_view(slot: Slot) -> torch.Tensor:
    """The slot's bytes as a flat ``uint8`` tensor (on the slot's device)."""
    assert slot.source is not None
    tensor = slot.source.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)
