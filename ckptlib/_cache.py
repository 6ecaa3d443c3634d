"""The bounded host cache that staged tensors live in until they are on disk.

Protocol: ``admit(nbytes)`` (blocks while the cache is full) → ``allocate`` → ``copy_into`` → the
writer writes the buffer → ``release(buffer)``. ``reserve`` is admit + allocate for one tensor; a
file that can only be written whole is admitted at once, so it never waits on itself. Released buffers are kept for the next checkpoint of the same
shapes, so steady-state staging allocates nothing; kept buffers count against the bound and are
dropped first when a new size needs room.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict

import numpy as np
import torch

logger = logging.getLogger(__name__)


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


class HostCache:
    """A byte budget of host buffers, pinned when asked and CUDA is present.

    Args:
        limit_bytes: The configured bound (``host_cache_size``).
        pin: Pin buffers when CUDA is present.
    """

    def __init__(self, *, limit_bytes: int, pin: bool) -> None:
        free = available_memory_bytes()
        # Never plan to hold more than the machine can give: a 50 GB setting on a 24 GB machine.
        self.limit_bytes = min(limit_bytes, int(free * 0.8)) if free else limit_bytes
        if self.limit_bytes < limit_bytes:
            logger.info(
                "[Concurrent Checkpoint] host cache bounded to %.2f GB of free memory (asked %.2f GB)",
                self.limit_bytes / 1e9,
                limit_bytes / 1e9,
            )
        self.pin = pin and torch.cuda.is_available()
        self._cond = threading.Condition()
        self._in_use = 0
        self._pooled: dict[int, list[torch.Tensor]] = defaultdict(list)
        self._pooled_bytes = 0
        self.peak_bytes = 0

    @property
    def held_bytes(self) -> int:
        with self._cond:
            return self._in_use + self._pooled_bytes

    def reserve(self, nbytes: int, *, held_by_caller: int = 0) -> torch.Tensor:
        """Admits ``nbytes`` (waiting while the cache is full) and returns a buffer of that size."""
        self.admit(nbytes, held_by_caller=held_by_caller)
        return self.allocate(nbytes)

    def admit(self, nbytes: int, *, held_by_caller: int = 0) -> None:
        """Waits until ``nbytes`` more fit under the bound, then counts them as in use.

        A request is also admitted once everything in use is the caller's own (``held_by_caller``,
        bytes that cannot be released before the caller goes on): one oversized tensor, or the
        small copies ``save`` makes itself, never deadlock the pipeline.
        """
        with self._cond:
            while self._in_use > held_by_caller and self._in_use + nbytes > self.limit_bytes:
                self._cond.wait()
            self._in_use += nbytes

    def allocate(self, nbytes: int) -> torch.Tensor:
        """A ``uint8`` host buffer of ``nbytes`` already admitted; a kept buffer when one fits."""
        with self._cond:
            pool = self._pooled.get(nbytes)
            if pool:
                self._pooled_bytes -= nbytes
                return pool.pop()
            self._trim_pool()
            self.peak_bytes = max(self.peak_bytes, self._in_use + self._pooled_bytes)
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)

    def release(self, buffer: torch.Tensor, *, keep: bool = True) -> None:
        """Gives a buffer back once its bytes are on disk (or the checkpoint failed)."""
        nbytes = buffer.numel()
        with self._cond:
            self._in_use -= nbytes
            if keep:
                self._pooled[nbytes].append(buffer)
                self._pooled_bytes += nbytes
                self._trim_pool()
            self._cond.notify_all()

    def unadmit(self, nbytes: int) -> None:
        """Returns admitted bytes that were never allocated (a failed checkpoint)."""
        with self._cond:
            self._in_use -= nbytes
            self._cond.notify_all()

    def clear(self) -> None:
        """Drops every pooled buffer (used at shutdown)."""
        with self._cond:
            self._pooled.clear()
            self._pooled_bytes = 0
            self._cond.notify_all()

    def _trim_pool(self) -> None:
        """Drops kept buffers, largest first, until everything held fits under the bound."""
        for size in sorted(self._pooled, reverse=True):
            pool = self._pooled[size]
            while pool and self._in_use + self._pooled_bytes > self.limit_bytes:
                pool.pop()
                self._pooled_bytes -= size
            if not pool:
                del self._pooled[size]


def copy_into(buffer: torch.Tensor, source: torch.Tensor, *, stream: object | None = None) -> torch.Tensor:
    """Copies ``source`` into the host ``buffer`` and returns the staged tensor (same dtype and shape).

    On CUDA the copy runs on ``stream`` (a side stream, so forward and backward keep the default
    one); the caller synchronizes the stream before the bytes are read. On the CPU a contiguous
    tensor is copied by one plain memcpy: torch's own copy would start a second OpenMP team
    beside the training thread's and oversubscribe the cores.
    """
    source = source.detach()
    if source.numel() == 0:
        return torch.empty(source.shape, dtype=source.dtype)
    staged = buffer.view(source.dtype).view(source.shape)
    if source.is_cuda and stream is not None:
        with torch.cuda.stream(stream):  # type: ignore[arg-type]
            staged.copy_(source, non_blocking=True)
    elif source.device.type == "cpu" and source.is_contiguous():
        np.copyto(buffer.numpy(), source.reshape(-1).view(torch.uint8).numpy())
    else:
        staged.copy_(source)
    return staged
