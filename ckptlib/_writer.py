"""Writing checkpoint files from write items, with ``O_DIRECT`` where the filesystem has it.

A file arrives as write items, each a page-aligned range ``[offset, offset + length)``: a staged
cache chunk, or a range of a live tensor that is page-aligned in memory and in the file (see
``ckptlib._stage``). Direct I/O sends those pages to the disk without copying them into the page
cache, which on a busy machine is most of the CPU a buffered write costs; the file's last chunk
is written rounded up to a whole page and the file is then truncated to its size. Where the
filesystem refuses ``O_DIRECT`` (tmpfs, some network filesystems), writes are buffered.

A file is finished (truncated, fsynced, closed) by the writer that completes its last pending
item after its end marker: ``reserve`` counts an item, ``done_one`` and ``end`` report whether
the caller is the one to ``close``.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ckptlib._format as _format
from ckptlib._cache import PAGE, Chunk
from ckptlib._zipcrc import CrcTracker, EntryCrc

_DIRECT = getattr(os, "O_DIRECT", 0)
# Offsets from a page boundary tried by ``memory_alignment``, smallest first.
_PROBE_OFFSETS = (4, 16, 64, 512, PAGE)
_ALIGNMENTS: dict[int, int] = {}

QUEUED, WRITING, DONE, REVOKED = "queued", "writing", "done", "revoked"

# Ranges from this size have their CRC-32 taken on a thread of their own beside the write.
_CRC_BESIDE = 1 << 20


class Latch:
    """A one-shot event: ``set`` once, ``wait`` until then. One lock, not ``threading.Event``'s
    condition and lock: every write item has one, made on the training thread."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # already set
            self._lock.release()

    def wait(self) -> None:
        with self._lock:
            pass


@dataclass(eq=False)
class WriteItem:
    """One thing for a writer.

    Attributes:
        chunk: Staged bytes for the range, or None.
        live: A ``uint8`` CPU tensor over live memory for the range (written without a copy;
            valid only until the next optimizer step), or None.
        gather: Segments ``(source, start, length)`` of live memory or bytes that make up the
            range, back to back: the writer copies them into its buffer and writes that; valid
            only until the next optimizer step. Or None.
        ready: A CUDA event recorded after the chunk's copies, or None.
        end: The end marker of ``sink``'s file.
        state: For live and gathered items: queued → writing → done, or revoked (staged
            instead).
    """

    job: Any
    sink: FileSink
    offset: int = 0
    length: int = 0
    chunk: Chunk | None = None
    live: Any = None
    gather: list[tuple[Any, int, int]] | None = None
    ready: Any = None
    end: bool = False
    state: str = QUEUED
    finished: Latch = field(default_factory=Latch)


def memory_alignment(directory: Path) -> int:
    """The alignment a buffer's address needs for a direct write to a file in ``directory``.

    Linux asks direct I/O for memory aligned to the device's DMA alignment (``statx``'s
    ``dio_mem_align``): 512 bytes on the development VM's virtio disk, 4 on many NVMe drives,
    not necessarily a page. A tensor whose memory sits at the same offset from such a boundary
    as its bytes do in the file can then be written straight from memory (``ckptlib._stage``),
    and the planner lays files out so that most do (``ckptlib._plan``). Probed once per
    filesystem: a page written with ``O_DIRECT`` from 4, 16, 64, 512 bytes past a page boundary;
    the first accepted offset is the alignment. 1 where the filesystem has no direct I/O
    (buffered writes read any address); a page where the probe cannot tell.
    """
    try:
        device = os.stat(directory).st_dev
    except OSError:
        return PAGE
    known = _ALIGNMENTS.get(device)
    if known is None:
        known = _ALIGNMENTS[device] = _probe_alignment(directory)
    return known


def _probe_alignment(directory: Path) -> int:
    if not _DIRECT:
        return 1
    path = directory / f".ckptlib-dio-probe-{os.getpid()}-{threading.get_ident()}"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _DIRECT, 0o600)
    except OSError as error:
        if error.errno == errno.EINVAL:  # no direct I/O here (tmpfs): buffered writes
            return 1
        return PAGE
    memory = mmap.mmap(-1, 2 * PAGE)
    view = memoryview(memory)
    try:
        for offset in _PROBE_OFFSETS:
            try:
                os.pwrite(fd, view[offset : offset + PAGE], 0)
            except OSError:
                continue
            return offset
        return PAGE
    finally:
        view.release()
        memory.close()
        os.close(fd)
        path.unlink(missing_ok=True)


class FileSink:
    """One file being written item by item."""

    def __init__(self, path: Path, *, size: int, crcs: list[EntryCrc] | None = None) -> None:
        self.path = path
        self.size = size
        # Zip entries whose CRC-32 is taken from the bytes as they are written.
        self._crcs = CrcTracker(crcs) if crcs else None
        self._fd: int | None = None
        self._direct = False
        self._lock = threading.Lock()
        self._pending = 0
        self._ended = False
        self._closing = False

    def reserve(self) -> None:
        """Counts one more item (or reservation) the file must wait for."""
        with self._lock:
            self._pending += 1

    def done_one(self) -> bool:
        """One counted item is written or dropped. True: the caller must now ``close`` the file."""
        with self._lock:
            self._pending -= 1
            return self._take_close()

    def end(self) -> bool:
        """Every item is counted. True: the caller must now ``close`` the file."""
        with self._lock:
            self._ended = True
            return self._take_close()

    def _take_close(self) -> bool:
        if self._ended and self._pending == 0 and not self._closing:
            self._closing = True
            return True
        return False

    def write(self, item: WriteItem, *, buffer: Any = None) -> None:
        """Writes the item's range from its chunk, its live memory, or ``buffer`` (a page-aligned
        buffer holding a gathered item's bytes)."""
        if buffer is not None:
            source = buffer
        else:
            source = item.chunk.mem if item.chunk is not None else item.live.numpy()
        view = memoryview(source).cast("B")
        # A direct write covers whole pages: the last one's padding is cut by ``close``.
        padded = (item.length + PAGE - 1) // PAGE * PAGE
        self._write_views(item.offset, [view[:padded]] if padded <= len(view) else None, [view[: item.length]])

    def write_vectors(self, offset: int, views: list[memoryview]) -> None:
        """Writes ``views`` back to back at ``offset`` in one system call: the ranges of several
        consecutive items, each a whole number of pages (a direct write's fixed cost, ~35 µs of
        CPU on the development VM, is paid once)."""
        self._write_views(offset, views, views)

    def _write_views(self, offset: int, direct: list[memoryview] | None, buffered: list[memoryview]) -> None:
        """Writes ``direct`` with ``O_DIRECT`` where the file has it (None: not whole pages), else
        ``buffered``; a filesystem that refuses the direct write turns the file buffered."""
        fd = self._open()
        # The zip records' CRC-32 is taken on another thread while this one's write is in the
        # kernel (zlib and the write both release the GIL): a live range is then held for the
        # longer of the two, not their sum, and the next optimizer step waits less for it.
        crc = None
        if self._crcs is not None:
            if sum(len(view) for view in buffered) >= _CRC_BESIDE:
                crc = _CrcBeside(self._crcs, offset, buffered)
            else:
                self._crcs.written(offset, buffered)
        try:
            if self._direct and direct is not None:
                try:
                    _format.write_at(fd, direct, offset)
                    return
                except OSError as error:
                    if error.errno != errno.EINVAL:
                        raise
                    self._fall_back_to_buffered()
            _format.write_at(self._open(), buffered, offset)
        finally:
            if crc is not None:
                crc.join()

    def close(self, *, durable: bool) -> None:
        """Sets the size (drops the last direct write's padding), writes the zip entries' CRC-32s,
        fsyncs if ``durable``, closes."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is None:
            if durable:
                # A file with no bytes at all (never opened): create it empty.
                _format.write_bytes_durably(self.path, b"")
            return
        try:
            if durable:
                os.ftruncate(fd, self.size)
                if self._crcs is not None:
                    self._crcs.write_fields(self.path)
                os.fsync(fd)
        finally:
            os.close(fd)

    def _open(self) -> int:
        with self._lock:
            if self._fd is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                if _DIRECT:
                    try:
                        self._fd = os.open(self.path, flags | _DIRECT, 0o644)
                        self._direct = True
                    except OSError as error:
                        if error.errno != errno.EINVAL:
                            raise
                if self._fd is None:
                    self._fd = os.open(self.path, flags, 0o644)
            return self._fd

    def _fall_back_to_buffered(self) -> None:
        with self._lock:
            if self._direct and self._fd is not None:
                os.close(self._fd)
                self._fd = os.open(self.path, os.O_WRONLY, 0o644)
                self._direct = False


class _CrcBeside(threading.Thread):
    """``CrcTracker.written`` on its own thread (joined by the writer before the range is done;
    an error is raised there)."""

    def __init__(self, crcs: CrcTracker, offset: int, views: list[memoryview]) -> None:
        super().__init__(name="ckptlib-crc", daemon=True)
        self._call = (crcs, offset, views)
        self._error: BaseException | None = None
        self.start()

    def run(self) -> None:
        crcs, offset, views = self._call
        try:
            crcs.written(offset, views)
        except BaseException as error:  # raised again by join
            self._error = error

    def join(self, timeout: float | None = None) -> None:
        super().join(timeout)
        if self._error is not None:
            raise self._error
