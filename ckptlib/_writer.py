"""Writing one checkpoint file from staged chunks, with ``O_DIRECT`` where the filesystem has it.

Chunk ``i`` of a file holds its bytes ``[i * chunk_bytes, …)``; writers may write chunks in any
order. Direct I/O sends the page-aligned chunk to the disk without copying it into the page cache,
which on a busy machine is most of the CPU a buffered write costs; the last chunk is written
rounded up to a whole page and the file is then truncated to its size. Where the filesystem
refuses ``O_DIRECT`` (tmpfs, some network filesystems), writes are buffered.
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

from ckptlib import _format
from ckptlib._cache import PAGE, Chunk

_DIRECT = getattr(os, "O_DIRECT", 0)


class FileSink:
    """One file being written chunk by chunk; ``finish`` truncates, fsyncs and closes it.

    Args:
        path: The file (in the checkpoint's temporary directory).
        size: Its final size in bytes.
        chunk_bytes: The size of every chunk but the last.
    """

    def __init__(self, path: Path, *, size: int, chunk_bytes: int) -> None:
        self.path = path
        self.size = size
        self.chunk_bytes = chunk_bytes
        self._fd: int | None = None
        self._direct = False
        self._cond = threading.Condition()
        self._written = 0

    def write(self, index: int, chunk: Chunk, length: int) -> None:
        """Writes ``length`` bytes of ``chunk`` as chunk number ``index`` of the file."""
        try:
            fd = self._open()
            offset = index * self.chunk_bytes
            if self._direct:
                padded = min(chunk.size, (length + PAGE - 1) // PAGE * PAGE)
                try:
                    _format.write_at(fd, memoryview(chunk.mem)[:padded], offset)
                    return
                except OSError as error:
                    if error.errno != errno.EINVAL:
                        raise
                    self._fall_back_to_buffered()
            _format.write_at(self._fd, memoryview(chunk.mem)[:length], offset)  # type: ignore[arg-type]
        finally:
            with self._cond:
                self._written += 1
                self._cond.notify_all()

    def skip(self) -> None:
        """Counts a chunk that is not written (its checkpoint already failed)."""
        with self._cond:
            self._written += 1
            self._cond.notify_all()

    def finish(self, chunks: int, *, durable: bool) -> None:
        """Waits until ``chunks`` writes are done, then sets the size, fsyncs (if ``durable``) and closes."""
        with self._cond:
            self._cond.wait_for(lambda: self._written >= chunks)
        fd, self._fd = self._fd, None
        if fd is None:
            if durable:
                raise OSError(errno.EIO, f"{self.path.name}: nothing was written")
            return
        try:
            if durable:
                os.ftruncate(fd, self.size)  # drops the last direct write's padding
                os.fsync(fd)
        finally:
            os.close(fd)

    def _open(self) -> int:
        with self._cond:
            if self._fd is None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
                try:
                    self._fd = os.open(self.path, flags | _DIRECT, 0o644) if _DIRECT else None
                    self._direct = self._fd is not None
                except OSError as error:
                    if error.errno != errno.EINVAL:
                        raise
                if self._fd is None:
                    self._fd = os.open(self.path, flags, 0o644)
            return self._fd

    def _fall_back_to_buffered(self) -> None:
        with self._cond:
            if self._direct:
                assert self._fd is not None
                os.close(self._fd)
                self._fd = os.open(self.path, os.O_WRONLY, 0o644)
                self._direct = False
