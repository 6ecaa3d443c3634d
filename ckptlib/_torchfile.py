"""Writing a ``torch.save`` file tensor by tensor, as the tensors are staged.

``torch.save`` needs every tensor at once, so a 1.3 GB ``optimizer.pt`` would need 1.3 GB of
cache before its first byte is written. This module splits what ``torch.serialization._save``
does (torch 2.13) in two:

1. ``pickle_metadata`` (in ``save``, while the live tensors are consistent): pickles the object
   with torch's persistent ids, which records only each storage's type, key, device and size;
2. ``write_streaming`` (writer thread): writes the same zip records, each storage's bytes taken
   from its staged copy as soon as it is staged, then gives the buffer back.

The file is byte-for-byte what ``torch.save`` writes, so ``torch.load(weights_only=True)`` reads it.
It applies only when every tensor owns its whole, contiguous storage (optimizer state does);
otherwise the caller falls back to ``torch.save`` of the fully staged object.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.serialization import DEFAULT_PROTOCOL, get_crc32_options, location_tag

from ckptlib._plan import Slot


def owns_whole_storage(tensor: torch.Tensor) -> bool:
    return (
        tensor.layout == torch.strided
        and tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
        and type(tensor) is torch.Tensor
    )


def pickle_metadata(obj: Any, slots: list[Slot]) -> tuple[bytes, list[int]] | None:
    """Pickles ``obj`` as ``torch.save`` does, without reading tensor data.

    Args:
        obj: The object with its live tensors.
        slots: The planned slots of those tensors (their ``source`` set).

    Returns:
        The ``data.pkl`` bytes and, for storage key 0, 1, …, the slot holding its bytes; None when
        some tensor does not own its whole storage.
    """
    slot_of_storage: dict[int, int] = {}
    for index, slot in enumerate(slots):
        assert slot.source is not None
        if not owns_whole_storage(slot.source):
            return None
        slot_of_storage.setdefault(slot.source.untyped_storage()._cdata, index)
    order: list[int] = []
    keys: dict[int, str] = {}

    def persistent_id(candidate: Any) -> tuple[Any, ...] | None:
        if not isinstance(candidate, torch.storage.TypedStorage):
            return None
        storage = candidate._untyped_storage
        key = keys.get(storage._cdata)
        if key is None:
            key = keys[storage._cdata] = str(len(keys))
            order.append(slot_of_storage[storage._cdata])
        storage_type = getattr(torch, candidate._pickle_storage_type())
        return ("storage", storage_type, key, location_tag(storage), candidate._size())

    class MetadataPickler(pickle.Pickler):
        def persistent_id(self, candidate: Any) -> Any:
            return persistent_id(candidate)

    buffer = io.BytesIO()
    try:
        MetadataPickler(buffer, protocol=DEFAULT_PROTOCOL).dump(obj)
    except KeyError:  # a storage that is not one of the slots' (should not happen)
        return None
    return buffer.getvalue(), order


def write_streaming(
    path: Path,
    pickled: bytes,
    order: list[int],
    slots: list[Slot],
    *,
    wait_staged: Callable[[int], None],
    release: Callable[[Slot], None],
) -> int:
    """Writes the zip records of a ``torch.save`` file, each storage once its slot is staged.

    Returns:
        The file's size.
    """
    writer = torch._C.PyTorchFileWriter(str(path), get_crc32_options(), torch.serialization._get_storage_alignment())
    writer.write_record("data.pkl", pickled, len(pickled))
    writer.write_record(".format_version", "1", len("1"))
    alignment = str(torch.serialization._get_storage_alignment())
    writer.write_record(".storage_alignment", alignment, len(alignment))
    writer.write_record("byteorder", sys.byteorder, len(sys.byteorder))
    written_slots = set()
    for key, slot_index in enumerate(order):
        wait_staged(slot_index + 1)
        slot = slots[slot_index]
        assert slot.staged is not None
        writer.write_record(f"data/{key}", slot.staged.untyped_storage(), slot.nbytes)
        written_slots.add(slot_index)
        release(slot)
    writer.write_end_of_file()
    del writer
    wait_staged(len(slots))
    for index, slot in enumerate(slots):
        if index not in written_slots:
            release(slot)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path.stat().st_size
