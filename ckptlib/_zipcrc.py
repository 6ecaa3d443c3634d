"""Real CRC-32s in the zip entries of the ``optimizer.pt`` files ckptlib streams.

``ckptlib._torchfile`` plans a ``torch.save`` file without reading a tensor, so torch's zip writer
leaves every CRC-32 field 0 (as after ``torch.serialization.set_crc32_options(False)``), which
``zipfile.ZipFile.testzip`` reports as damage. Here:

* ``zip_entries`` reads the planned zip's structure once per layout (``zipfile`` over the pieces,
  tensor bytes read as zeros; ``ckptlib._torchfile`` keeps the answer with the layout, which a
  training run reuses at every save) and returns, for every entry, where its bytes lie in the file
  and where its two CRC fields are. No CRC is taken inside ``save``: metadata records
  (``data.pkl``, ``byteorder``, ...) are written with 0 there like the storages;
* ``CrcTracker`` (one per file, owned by ``ckptlib._writer.FileSink``) takes the CRC-32 of each
  range a writer writes, as it writes it (``zlib.crc32`` over bytes already in memory, ~2 GB/s on
  the writer thread), and at the file's close combines the ranges of each entry in file order
  (``crc32_combine``: writers finish ranges out of order) and writes the result into the entry's
  CRC fields. An entry whose ranges do not tile it exactly (a range written twice with other
  bounds) is read back from the file instead.
"""

from __future__ import annotations

import bisect
import io
import os
import struct
import threading
import zipfile
import zlib
from dataclasses import dataclass, field
from typing import Any

_POLY = 0xEDB88320
_LOCAL_CRC = 14  # offset of the CRC-32 in a local file header
_CENTRAL_CRC = 16  # and in a central directory header
_READ = 64 << 20


def _multmodp(a: int, b: int) -> int:
    """a × b modulo the CRC-32 polynomial (reflected), as zlib's ``multmodp``."""
    m = 1 << 31
    p = 0
    while True:
        if a & m:
            p ^= b
            if a & (m - 1) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1


_X2N = [1 << 30]  # x^(2^k) modulo the polynomial
for _ in range(31):
    _X2N.append(_multmodp(_X2N[-1], _X2N[-1]))


def crc32_combine(crc1: int, crc2: int, length2: int) -> int:
    """The CRC-32 of A + B from ``crc32(A)``, ``crc32(B)`` and ``len(B)`` (zlib's ``crc32_combine``)."""
    power = 1 << 31  # x^0
    k = 3  # x^(8 × length2): bytes to bits
    while length2:
        if length2 & 1:
            power = _multmodp(_X2N[k & 31], power)
        length2 >>= 1
        k += 1
    return _multmodp(power, crc1) ^ crc2


@dataclass(frozen=True)
class EntryCrc:
    """A zip entry whose CRC-32 is known only once its bytes are written.

    Attributes:
        start: File offset of the entry's bytes (stored, not compressed).
        length: Their length.
        fields: File offsets of its CRC-32 fields (local header, central directory).
    """

    start: int
    length: int
    fields: tuple[int, ...]


class _PlannedFile(io.RawIOBase):
    """The planned file, read-only: bytes pieces as they are, tensor ranges as zeros."""

    def __init__(self, pieces: list[Any]) -> None:
        super().__init__()
        self._starts: list[int] = []
        self._pieces = pieces
        position = 0
        for piece in pieces:
            self._starts.append(position)
            position += len(piece) if isinstance(piece, bytes) else piece[2]
        self._size = position
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._position, 2: self._size}[whence]
        self._position = max(0, base + offset)
        return self._position

    def tell(self) -> int:
        return self._position

    def read(self, size: int | None = -1) -> bytes:
        end = self._size if size is None or size < 0 else min(self._size, self._position + size)
        out = bytearray()
        while self._position < end:
            index = bisect.bisect_right(self._starts, self._position) - 1
            piece = self._pieces[index]
            inside = self._position - self._starts[index]
            length = len(piece) if isinstance(piece, bytes) else piece[2]
            take = min(length - inside, end - self._position)
            out += piece[inside : inside + take] if isinstance(piece, bytes) else bytes(take)
            self._position += take
        return bytes(out)


def zip_entries(pieces: list[Any]) -> list[EntryCrc]:
    """Every entry of the planned zip ``pieces``: where its bytes and its CRC-32 fields are.

    Raises:
        ValueError: An entry is compressed (torch's writer stores every record).
    """
    planned = _PlannedFile(pieces)
    with zipfile.ZipFile(planned) as archive:
        infos = archive.infolist()
        central = archive.start_dir
    entries: list[EntryCrc] = []
    for info in infos:
        planned.seek(central)
        header = planned.read(46)
        name_length, extra_length, comment_length = struct.unpack("<HHH", header[28:34])
        fields = (info.header_offset + _LOCAL_CRC, central + _CENTRAL_CRC)
        central += 46 + name_length + extra_length + comment_length
        planned.seek(info.header_offset)
        local = planned.read(30)
        start = info.header_offset + 30 + sum(struct.unpack("<HH", local[26:30]))
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise ValueError(f"zip entry {info.filename} is not stored")
        entries.append(EntryCrc(start=start, length=info.file_size, fields=fields))
    return entries


@dataclass
class CrcTracker:
    """The CRC-32s of one file's tensor entries, from the ranges its writers write."""

    entries: list[EntryCrc]
    _starts: list[int] = field(init=False)
    _parts: list[dict[int, tuple[int, int]]] = field(init=False)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.entries = sorted(self.entries, key=lambda entry: entry.start)
        self._starts = [entry.start for entry in self.entries]
        self._parts = [{} for _ in self.entries]

    def written(self, offset: int, views: list[memoryview]) -> None:
        """Records the CRC-32 of each entry's share of ``views``, written back to back at ``offset``."""
        for view in views:
            end = offset + len(view)
            index = max(0, bisect.bisect_right(self._starts, offset) - 1)
            while index < len(self.entries) and self.entries[index].start < end:
                entry = self.entries[index]
                low, high = max(offset, entry.start), min(end, entry.start + entry.length)
                if low < high:
                    crc = zlib.crc32(view[low - offset : high - offset])
                    with self._lock:
                        self._parts[index][low] = (high - low, crc)
                index += 1
            offset = end

    def write_fields(self, path: os.PathLike[str] | str) -> None:
        """Writes every entry's CRC-32 into its fields (buffered; the caller's fsync makes it durable)."""
        fd = os.open(path, os.O_RDWR)
        try:
            for entry, parts in zip(self.entries, self._parts, strict=True):
                crc = self._combined(entry, parts)
                if crc is None:
                    crc = _read_crc(fd, entry)
                for where in entry.fields:
                    os.pwrite(fd, struct.pack("<I", crc), where)
        finally:
            os.close(fd)

    @staticmethod
    def _combined(entry: EntryCrc, parts: dict[int, tuple[int, int]]) -> int | None:
        crc = 0
        position = entry.start
        end = entry.start + entry.length
        while position < end:
            part = parts.get(position)
            if part is None:
                return None
            length, part_crc = part
            crc = crc32_combine(crc, part_crc, length)
            position += length
        return crc if position == end else None


def _read_crc(fd: int, entry: EntryCrc) -> int:
    crc = 0
    position = entry.start
    end = entry.start + entry.length
    while position < end:
        data = os.pread(fd, min(_READ, end - position), position)
        if not data:
            raise OSError(f"file ends inside a zip entry at {position}")
        crc = zlib.crc32(data, crc)
        position += len(data)
    return crc
