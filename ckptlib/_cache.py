"""The bounded host cache: page-aligned chunks that staged file bytes live in until written.

Staging fills a chunk with the next bytes of a checkpoint file (headers and tensor bytes, in
file order) and hands it to a writer, which writes it at its offset with ``O_DIRECT`` and gives
it back. ``acquire`` blocks while the chunks in use reach the bound, so staging waits for
flushing instead of growing memory. Chunks are anonymous ``mmap`` regions: page-aligned (what
``O_DIRECT`` needs), pinned with ``cudaHostRegister`` when asked and CUDA is present, and
returned to the system when dropped. Up to ``keep_bytes`` of chunks given back are kept for reuse
(a fresh chunk costs a page fault per page on first touch).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import threading

import numpy as np
import torch

logger = logging.getLogger(__name__)

PAGE = 4096
_HUGE_PAGE = 2 << 20
_MAX_CHUNK = 32 << 20
_MIN_CHUNKS = 4


def available_memory_bytes() -> int | None:
    """``MemAvailable`` from /proc/meminfo, or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Chunk:
    """One page-aligned host buffer of ``size`` bytes (``array``: numpy view, ``tensor``: torch view)."""

    __slots__ = ("_pinned", "array", "mem", "size", "tensor")

    def __init__(self, size: int, *, pin: bool) -> None:
        self.size = size
        self.mem = mmap.mmap(-1, size)
        if size >= _HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE"):
            with contextlib.suppress(OSError):
                self.mem.madvise(mmap.MADV_HUGEPAGE)  # 512× fewer first-touch page faults
        self.array = np.frombuffer(self.mem, dtype=np.uint8)
        self.tensor = torch.from_numpy(self.array)
        self._pinned = False
        if pin:
            status = torch.cuda.cudart().cudaHostRegister(self.tensor.data_ptr(), size, 0)
            self._pinned = int(status) == 0

    def close(self) -> None:
        if self._pinned:
            torch.cuda.cudart().cudaHostUnregister(self.tensor.data_ptr())
            self._pinned = False
        del self.tensor, self.array
        with contextlib.suppress(BufferError):  # a view is still alive somewhere; the GC frees it later
            self.mem.close()


class HostCache:
    """A byte budget of staging chunks.

    Args:
        limit_bytes: The configured bound (``host_cache_size``), capped at 80 % of free memory.
        pin: Pin chunks when CUDA is present.
    """

    def __init__(self, *, limit_bytes: int, pin: bool) -> None:
        free = available_memory_bytes()
        # Never plan to hold more than the machine can give: a 50 GB setting on a 24 GB machine.
        self.limit_bytes = min(limit_bytes, int(free * 0.8)) if free else limit_bytes
        if self.limit_bytes < limit_bytes:
            logger.info(
                "[Concurrent Checkpoint] host cache bounded to %.2f GB of free memory (asked %.2f GB)",
                self.limit_bytes / (1 << 30),
                limit_bytes / (1 << 30),
            )
        # Small enough that several fit under the bound, large enough for full-speed direct I/O.
        self.chunk_bytes = max(PAGE, min(_MAX_CHUNK, self.limit_bytes // _MIN_CHUNKS // PAGE * PAGE))
        self.pin = pin and torch.cuda.is_available()
        self._cond = threading.Condition()
        self._in_use = 0
        self._free: list[Chunk] = []
        self.peak_bytes = 0

    @property
    def in_use_bytes(self) -> int:
        with self._cond:
            return self._in_use

    def acquire(self, *, timeout: float | None = None) -> Chunk | None:
        """A chunk, waiting while the chunks in use fill the bound; None on timeout.

        One chunk is always granted when none is in use, so a bound smaller than a chunk still
        makes progress.
        """
        with self._cond:
            granted = self._cond.wait_for(lambda: self._in_use == 0 or self._in_use + self.chunk_bytes <= self.limit_bytes, timeout)
            if not granted:
                return None
            self._in_use += self.chunk_bytes
            self.peak_bytes = max(self.peak_bytes, self._in_use)
            if self._free:
                return self._free.pop()
        return Chunk(self.chunk_bytes, pin=self.pin)

    def release(self, chunk: Chunk, *, keep_bytes: int | None = None) -> None:
        """Gives a chunk back once its bytes are on disk (or its checkpoint failed)."""
        keep = self.limit_bytes if keep_bytes is None else keep_bytes
        with self._cond:
            self._in_use -= chunk.size
            if (len(self._free) + 1) * chunk.size <= keep and self._in_use + (len(self._free) + 1) * chunk.size <= self.limit_bytes:
                self._free.append(chunk)
                chunk = None  # type: ignore[assignment]
            self._cond.notify_all()
        if chunk is not None:
            chunk.close()

    def trim(self, keep_bytes: int) -> None:
        """Drops kept chunks until at most ``keep_bytes`` are kept."""
        with self._cond:
            dropped = []
            while self._free and len(self._free) * self.chunk_bytes > keep_bytes:
                dropped.append(self._free.pop())
        for chunk in dropped:
            chunk.close()

    def clear(self) -> None:
        """Drops every kept chunk (used at shutdown)."""
        self.trim(0)
