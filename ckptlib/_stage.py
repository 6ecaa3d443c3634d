"""Staging: turning a checkpoint's bytes, in file order, into write items for the writers.

Each file's bytes become page-aligned ranges, each either

* **live**: a page-aligned range of the file whose bytes are a CPU tensor's memory at an address
  aligned for direct I/O (``ckptlib._writer.memory_alignment``: 512 bytes on the development
  VM's disk, a page at most). Large tensors are, when torch allocates them page-aligned
  (``THP_MEM_ALLOC_ENABLE=1``, which the console sets for every job), and so are tensors at any
  address when the file puts their bytes at the same offset from an alignment boundary (the
  planner lays ``.safetensors`` files out so: ``ckptlib._plan``). The writer sends it to the
  disk straight from the tensor; nothing is copied. Parameters and optimizer state do not
  change until the next optimizer step, so this is valid until then; or
* **gathered**: the other bytes of a CPU file (headers, small or unaligned tensors), handed
  over as a list of segments of live memory covering up to ``gather_bytes`` of the file; the
  writer copies them into its own buffer and writes that (one write per item). The copy is the
  writer's, not the training thread's; like a live range it is valid only until the next
  optimizer step; or
* **staged**: copied into a host-cache chunk (tensors on a device; everything once the next
  step is near, see below).

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
ranges and gathered items not yet taken by a writer are revoked and copied too, and one being
written (a live range) or copied (a gathered item) is waited for: parameters and optimizer state
are about to change. A checkpoint whose state has no optimizer (nothing says when it changes)
is staged by copying, before ``save`` returns.

Tensors on a CUDA device are copied on a side stream (``ckptlib._device.DeviceCopies`` has the rules and
their reasons). That path is **unverified on a GPU**: it was written by the CUDA stream rules and
its order of calls is tested on the CPU against a recording stand-in for ``torch.cuda``
(``tests/test_cuda_staging_logic.py``); ``python -m ckptlib.tests.gpu_check`` checks it on a GPU.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ckptlib._cache import PAGE, Chunk, HostCache
from ckptlib._device import DeviceCopies, is_device
from ckptlib._plan import FilePlan, Slot
from ckptlib._writer import DONE, QUEUED, REVOKED, WRITING, FileSink, WriteItem

# Live ranges smaller than this are copied: each is one more item to hand over and claim.
# (A direct write's fixed cost no longer counts: a writer sends consecutive items in one call.)
_MIN_LIVE = 64 << 10
# The most bytes of one gathered item (the writers' buffers are this large).
_MAX_GATHER = 16 << 20


@dataclass(eq=False)
class _Cursor:
    """Where staging of one checkpoint stands."""

    job: Any
    file_index: int = 0
    piece_index: int = 0
    piece_offset: int = 0
    file_pos: int = 0
    sink: FileSink | None = None
    chunk: Chunk | _Gather | None = None  # a gathered item while ``gather``
    chunk_offset: int = 0
    used: int = 0
    sources: dict[int, torch.Tensor] = field(default_factory=dict)
    live: list[WriteItem] = field(default_factory=list)
    live_checked: int = 0  # live[:live_checked] are known to be finished
    gather: bool = False  # the current file's bytes are gathered by the writers, not copied here
    copied: bool = False
    allow_live: bool = True
    # CUDA only: an event on each device's compute stream, recorded at save(); the devices whose
    # copy stream already waits for it; the copy streams used since the current chunk began.
    saved_events: dict[Any, Any] = field(default_factory=dict)
    device_waited: set[Any] = field(default_factory=set)
    chunk_streams: list[Any] = field(default_factory=list)


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
        # One write per gathered item: large enough that a writer wakes a few times per
        # checkpoint, small enough that its buffer (one per writer) is a small part of memory.
        self.gather_bytes = min(cache.chunk_bytes, _MAX_GATHER)
        self._send = hand_over
        # Items made by an ordinary run, handed over together when it returns (None: at once).
        self._held: list[WriteItem] | None = None
        self._device = DeviceCopies()
        self._lock = threading.Lock()
        self._items_lock = threading.Lock()
        self._cursors: list[_Cursor] = []
        self.last_run = time.monotonic()
        self.copied_bytes = 0
        self.live_bytes = 0

    @property
    def idle(self) -> bool:
        """Nothing to stage, and no device copy left to wait for (``run(force=True)`` waits)."""
        return not self._cursors and not self._device.in_flight

    @property
    def handed_over(self) -> bool:
        """Every checkpoint in flight has handed all its bytes over (what is left waits for the
        writers, or for the next ``run(force=True)``): ordinary points have nothing to do."""
        return all(cursor.copied for cursor in list(self._cursors))

    def add(self, job: Any, *, live: bool) -> None:
        """Queues a checkpoint; ``live``: its tensors stay unchanged until ``run(force=True)``.

        Called on the training thread by ``save``: on CUDA, this is where the copies' starting
        point on each device's compute stream is recorded.
        """
        cursor = _Cursor(job, allow_live=live)
        cursor.saved_events = self._device.mark_save(job.plan)
        with self._lock:
            self._cursors.append(cursor)

    def run(self, *, force: bool) -> bool:
        """Stages what it may now. Returns whether it did anything.

        With ``force`` it returns only once every checkpoint in flight is staged (no live range
        left to write); without, it returns at once when another thread is staging or the window
        is full.
        """
        if not self._cursors:
            if force:
                self._device.synchronize()  # copies issued by an earlier, unforced run
            return False
        if not self._lock.acquire(blocking=force):
            return False
        self.last_run = time.monotonic()
        if not force:
            # An ordinary run waits for nothing: its items go to the writers when it returns, so
            # a writer woken by the first one does not contend for the GIL with the rest of
            # ``save`` on the training thread (and finds the file's items queued together).
            self._held = []
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
                    elif self._live_pending(cursor):
                        break
                except Exception as error:  # staging runs inside training: never raise there
                    self._abandon(cursor, f"staging failed: {error!r}")
                cursor.live.clear()
                self._cursors.pop(0)
                cursor.job.staged.set()
            if force:
                # The optimizer step comes next and overwrites the sources: every copy still in
                # flight on a copy stream must have finished reading them.
                self._device.synchronize()
            return True
        finally:
            held, self._held = self._held, None
            for item in held or ():
                self._send(item)
            self.last_run = time.monotonic()
            self._lock.release()

    def _hand_over(self, item: WriteItem) -> None:
        if self._held is not None:
            self._held.append(item)
        else:
            self._send(item)

    @staticmethod
    def _live_pending(cursor: _Cursor) -> bool:
        # Called at every hook point while a checkpoint's live items are out: items finish
        # mostly in order, so the scan resumes where the last one stopped.
        live = cursor.live
        while cursor.live_checked < len(live) and live[cursor.live_checked].state in (DONE, REVOKED):
            cursor.live_checked += 1
        return cursor.live_checked < len(live)

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

    def end_live_write(self, item: WriteItem, *, gathered: bool = False) -> None:
        """Called by a writer once a live item no longer reads live memory (``gathered``: it
        copied the item's segments into its buffer)."""
        with self._items_lock:
            if item.state == WRITING:
                item.state = DONE
            if gathered:
                self.copied_bytes += item.length
        item.finished.set()

    # ---- copying ----------------------------------------------------------------------------

    def _advance(self, cursor: _Cursor, *, force: bool) -> bool:
        """Hands over the job's next bytes; True once all of them are handed over."""
        job = cursor.job
        files: list[FilePlan] = job.plan.files
        while cursor.file_index < len(files):
            plan = files[cursor.file_index]
            if cursor.sink is None:
                cursor.sink = FileSink(job.directory / plan.name, size=plan.size, crcs=plan.crcs)
                cursor.gather = cursor.allow_live and not force and not any(slot.source is not None and is_device(slot.source) for slot in plan.slots)
            while job.error is None and cursor.piece_index < len(plan.pieces):
                piece = plan.pieces[cursor.piece_index]
                source: bytes | torch.Tensor
                if isinstance(piece, bytes):
                    source, start, length = piece, 0, len(piece)
                    live_ok = False
                else:
                    slot_index, start, length = piece
                    tensor = cursor.sources.get(slot_index)
                    if tensor is None:
                        slot = plan.slots[slot_index]
                        if slot.source is not None and is_device(slot.source):
                            tensor = self._device.byte_view(cursor, slot.source)
                        else:
                            tensor = _byte_view(slot)
                        cursor.sources[slot_index] = tensor
                    source = tensor
                    live_ok = cursor.allow_live and _can_write_live(
                        source, start + cursor.piece_offset, cursor.file_pos, length - cursor.piece_offset, job.mem_align
                    )
                while job.error is None and cursor.piece_offset < length:
                    left = length - cursor.piece_offset
                    if live_ok and cursor.file_pos % PAGE == 0:
                        assert isinstance(source, torch.Tensor)  # only a tensor's bytes are written live
                        self._send_live(cursor, source, start + cursor.piece_offset, left // PAGE * PAGE)
                        live_ok = False
                        continue
                    if cursor.chunk is None and cursor.gather:
                        cursor.chunk, cursor.used, cursor.chunk_offset = _Gather(self.gather_bytes), 0, cursor.file_pos
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
                    self._copy(cursor, cursor.chunk, cursor.used, source, start + cursor.piece_offset, take)
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
                    if not isinstance(cursor.chunk, _Gather):
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

    def _copy(self, cursor: _Cursor, chunk: Chunk | _Gather, offset: int, source: bytes | torch.Tensor, start: int, length: int) -> None:
        if isinstance(chunk, _Gather):
            chunk.segments.append((source, start, length))  # the writer copies it
            return
        if isinstance(source, bytes):
            chunk.array[offset : offset + length] = np.frombuffer(source, dtype=np.uint8, count=length, offset=start)
        elif not is_device(source):
            _copy_cpu(chunk.array[offset : offset + length], source[start : start + length])
        else:
            self._device.copy(cursor, chunk.tensor[offset : offset + length], source[start : start + length])
        with self._items_lock:
            self.copied_bytes += length

    def _send_chunk(self, cursor: _Cursor) -> None:
        assert cursor.chunk is not None and cursor.sink is not None
        if isinstance(cursor.chunk, _Gather):
            item = WriteItem(cursor.job, cursor.sink, cursor.chunk_offset, cursor.used, gather=cursor.chunk.segments)
            cursor.live.append(item)
            cursor.sink.reserve()
            self._hand_over(item)
            cursor.chunk = None
            return
        # The writer waits for this before reading the chunk (None: only CPU copies, done).
        ready = self._device.chunk_ready(cursor.chunk_streams)
        cursor.chunk_streams = []
        cursor.sink.reserve()
        self._hand_over(WriteItem(cursor.job, cursor.sink, cursor.chunk_offset, cursor.used, chunk=cursor.chunk, ready=ready))
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
        """Before the optimizer step: copies the live items no writer has taken, waits for the
        rest (a live range being written, a gathered item being copied)."""
        for item in cursor.live[cursor.live_checked :]:
            with self._items_lock:
                revoke = item.state == QUEUED
                if revoke:
                    item.state = REVOKED
                    item.sink.reserve()  # held until the copies are handed over
            if revoke:
                if cursor.job.error is None:
                    self._copy_revoked(cursor, item)
                    if item.gather is None:
                        self.live_bytes -= item.length
                self._hand_over(WriteItem(cursor.job, item.sink))  # releases the reservation
            else:
                item.finished.wait()

    def _copy_revoked(self, cursor: _Cursor, item: WriteItem) -> None:
        segments = item.gather if item.gather is not None else [(item.live, 0, item.length)]
        done = 0
        chunk: Chunk | None = None
        used = 0
        for source, start, length in segments:
            copied = 0
            while copied < length:
                if chunk is None:
                    chunk = self._next_chunk(cursor.job, force=True)
                    if chunk is None:  # the checkpoint failed meanwhile
                        return
                    used = 0
                take = min(chunk.size - used, length - copied)
                self._copy(cursor, chunk, used, source, start + copied, take)
                used += take
                copied += take
                if used == chunk.size:
                    self._hand_over_revoked(cursor, item, chunk, done, used)
                    done += used
                    chunk = None
        if chunk is not None:
            self._hand_over_revoked(cursor, item, chunk, done, used)

    def _hand_over_revoked(self, cursor: _Cursor, item: WriteItem, chunk: Chunk, done: int, used: int) -> None:
        item.sink.reserve()
        self._hand_over(WriteItem(cursor.job, item.sink, item.offset + done, used, chunk=chunk))


class _Gather:
    """A gathered item being built: segments ``(source, start, length)`` of live memory (or
    bytes) for up to ``size`` bytes of a file, copied by the writer that takes the item."""

    __slots__ = ("segments", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.segments: list[tuple[Any, int, int]] = []


def copy_segments(target: np.ndarray, segments: list[tuple[Any, int, int]]) -> None:
    """Copies gathered segments (CPU tensors' bytes or ``bytes``) back to back into ``target``."""
    offset = 0
    for source, start, length in segments:
        if isinstance(source, bytes):
            target[offset : offset + length] = np.frombuffer(source, dtype=np.uint8, count=length, offset=start)
        else:
            _copy_cpu(target[offset : offset + length], source[start : start + length])
        offset += length


def _can_write_live(source: Any, start: int, file_pos: int, length: int, mem_align: int) -> bool:
    """Whether part of this range can be written straight from memory: a CPU tensor whose memory
    is as far from a ``mem_align`` boundary as its file position is, with at least ``_MIN_LIVE``
    bytes past the range's first page boundary in the file (where the live part starts: its
    address there is aligned)."""
    if isinstance(source, bytes) or is_device(source):
        return False
    address = source.data_ptr() + start
    if (address - file_pos) % mem_align:
        return False
    return length - (-file_pos % PAGE) >= _MIN_LIVE


def _copy_cpu(target: np.ndarray, source: torch.Tensor) -> None:
    """A single-threaded memcpy (numpy's), not torch's parallel ``copy_``.

    torch splits a copy across its intra-op threads and waits for all of them at the end; when
    another thread (a writer, another process) holds a core, that wait lasts until the
    descheduled worker runs again. On the 2-core development VM under load, 40 copies of 0.7 MB
    took 300 ms with ``copy_`` on 2 threads and 1.3 ms with numpy; even 16 MB pieces copied as
    fast or faster on one thread (a memcpy is bound by memory bandwidth, not by cores).
    """
    try:
        array = source.numpy()
    except (RuntimeError, TypeError):  # a tensor numpy cannot view: torch's copy
        torch.from_numpy(target).copy_(source)
        return
    np.copyto(target, array)


def _byte_view(slot: Slot) -> torch.Tensor:
    """The slot's bytes as a flat ``uint8`` tensor (on the slot's device)."""
    assert slot.source is not None
    tensor = slot.source
    if tensor.dtype == torch.uint8 and tensor.dim() == 1 and tensor.is_contiguous():
        return tensor  # a streamed storage (``ckptlib._torchfile``): already its bytes, never grad
    tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor.reshape(-1).view(torch.uint8)
