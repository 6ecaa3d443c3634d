"""The bytes of a ``torch.save`` file, planned without reading a tensor.

``torch.save`` needs every tensor at once and writes them itself, so a 1.3 GB ``optimizer.pt``
would be copied and written synchronously. This module runs torch's own zip writer
(``PyTorchFileWriter``, torch 2.13) once inside ``save`` with a writer callback that records what
it is given instead of writing it: metadata (zip headers, ``data.pkl``, padding) is kept as
bytes, and each storage's record is handed a placeholder of the right size (an untouched
anonymous mapping, so no memory is used) and recorded as a reference to the live storage. The
stager later copies those storages into the host cache in file order.

Storage records start page-aligned in the file (torch's default is 64 bytes; ``torch.load``
reads any), so a page-aligned storage can be written straight from memory. torch's writer
leaves the CRC-32 fields 0 here (it never sees the bytes); ``ckptlib._zipcrc`` has the writers
compute every record's as they write it and fill the fields in before the file's fsync, so
``zipfile.ZipFile.testzip`` accepts the file and ``torch.load`` reads it as before. The zip's
structure (where each record and its CRC fields lie) is read once per layout, not at every save.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import weakref
from typing import Any

import numpy as np
import torch
from torch.serialization import DEFAULT_PROTOCOL, location_tag

from ckptlib._zipcrc import EntryCrc, zip_entries

_PAGE = 4096

Piece = bytes | tuple[int, int, int]
"""A run of a file's bytes: literal bytes, or ``(slot, start, length)`` of a slot's tensor bytes
(``ckptlib._plan.FilePlan.pieces``)."""


def streamed_pieces(obj: Any) -> tuple[list[torch.Tensor], list[Piece], list[EntryCrc]] | None:
    """Plans ``obj`` as the zip records of a ``torch.save`` file.

    Returns:
        One ``uint8`` tensor over each storage (live, in storage-key order), the file's pieces
        referring to them by index (CRC-32 fields 0), and every zip record, whose CRC-32 the
        writers compute (``ckptlib._zipcrc.CrcTracker``); None when ``obj`` cannot be pickled
        this way (the caller then serializes it with ``torch.save``).
    """
    skeleton = _skeleton(obj)
    if skeleton is not None:
        signature, storages = skeleton
        pickled = _PICKLES.get(signature)
        if pickled is None:
            made = _pickle_metadata(obj)
            if made is None:
                return None
            pickled, keyed = made
            # Storage keys follow first appearance in pickling order, as the signature's indices
            # do; anything else (never seen) is not reused.
            if len(signature) <= _MAX_SKELETON and [s._cdata for s in keyed] == [s._cdata for s in storages]:
                if len(_PICKLES) >= _MAX_PICKLES:
                    _PICKLES.clear()
                _PICKLES[signature] = pickled
            storages = keyed
    else:
        made = _pickle_metadata(obj)
        if made is None:
            return None
        pickled, storages = made
    sources = [torch.empty(0, dtype=torch.uint8, device=s.device).set_(s) for s in storages]
    pieces, entries = _zip_pieces(pickled, [s.nbytes() for s in storages])
    return sources, pieces, entries


def _pickle_metadata(obj: Any) -> tuple[bytes, list[torch.UntypedStorage]] | None:
    """``data.pkl`` of ``obj`` as ``torch.save`` writes it, and its storages in key order; None
    when ``obj`` cannot be pickled this way."""
    storages: list[torch.UntypedStorage] = []
    keys: dict[int, str] = {}
    typed_storage = torch.storage.TypedStorage

    def persistent_id(candidate: Any) -> tuple[Any, ...] | None:
        # As torch.serialization._save's persistent_id does for TypedStorage. Called for every
        # object pickled: the common case returns at once.
        if not isinstance(candidate, typed_storage):
            return None
        storage = candidate._untyped_storage
        key = keys.get(storage._cdata)
        if key is None:
            key = keys[storage._cdata] = str(len(keys))
            storages.append(storage)
        storage_type = getattr(torch, candidate._pickle_storage_type())
        return ("storage", storage_type, key, location_tag(storage), candidate._size())

    buffer = io.BytesIO()
    pickler = _MetadataPickler(buffer, protocol=DEFAULT_PROTOCOL)
    # An attribute, not a method: one Python call per object (pickle documents both; typeshed
    # declares only the method).
    pickler.persistent_id = persistent_id  # type: ignore[method-assign]
    try:
        pickler.dump(obj)
    except Exception:  # anything unusual goes through torch.save instead
        return None
    return buffer.getvalue(), storages


# ``data.pkl`` by skeleton (``_skeleton``): the same state is saved again and again with only its
# tensors' bytes changed, and pickling it with a Python ``persistent_id`` (called for every object)
# costs ~30 µs per tensor; the skeleton is pickled in C but for one Python call per tensor.
_PICKLES: dict[bytes, bytes] = {}
_MAX_PICKLES = 32
# Larger skeletons (plain values inline: a big list in the state) are not kept.
_MAX_SKELETON = 1 << 20


class _Unsupported(Exception):
    pass


def _tensor_placeholder(*description: Any) -> None:
    """Stands for a tensor in a skeleton (pickled by name, never called)."""


class _SkeletonPickler(pickle.Pickler):
    """Pickles an object with each plain tensor replaced by what its ``data.pkl`` record depends
    on: its storage's index in order of first appearance and size, dtype, device, offset,
    shape, strides, ``requires_grad``. Raises ``_Unsupported`` for what ``_pickle_metadata``
    pickles otherwise (storages outside a tensor, tensor subclasses, tensors with hooks or
    attributes)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=DEFAULT_PROTOCOL)
        self.storages: list[torch.UntypedStorage] = []
        self._indices: dict[int, int] = {}

    def reducer_override(self, candidate: Any) -> Any:
        # Not called for exact ints, floats, strs, bytes, lists, tuples, dicts (pickle's fast path).
        if type(candidate) is torch.Tensor:
            reduced = _reduce_tensor(candidate)
            if reduced is NotImplemented or reduced[0] is not torch._utils._rebuild_tensor_v2:
                raise _Unsupported
            typed, offset, size, stride, requires_grad, hooks, *metadata = reduced[1]
            if hooks:
                raise _Unsupported
            storage = typed._untyped_storage
            index = self._indices.get(storage._cdata)
            if index is None:
                index = self._indices[storage._cdata] = len(self.storages)
                self.storages.append(storage)
            # Plain values only: each object pickled here by reduction is one more Python call.
            description = (index, storage.nbytes(), str(candidate.dtype), location_tag(storage), offset, tuple(size), stride, requires_grad)
            return _tensor_placeholder, (*description, *metadata)
        if isinstance(candidate, (torch.Tensor, torch.storage.TypedStorage, torch.UntypedStorage)):
            raise _Unsupported
        return NotImplemented


def _skeleton(obj: Any) -> tuple[bytes, list[torch.UntypedStorage]] | None:
    """``obj``'s skeleton (``_SkeletonPickler``) and its storages in order of first appearance:
    equal skeletons have equal ``data.pkl``. None when it has none."""
    buffer = io.BytesIO()
    pickler = _SkeletonPickler(buffer)
    try:
        pickler.dump(obj)
    except Exception:  # _Unsupported, or what cannot be pickled: not reused
        return None
    return buffer.getvalue(), pickler.storages


# Each tensor's reduction (what ``Tensor.__reduce_ex__`` returns), kept with what it depends on:
# the same tensors are saved at every checkpoint, and the reduction is most of the pickling.
# By id: a WeakKeyDictionary would compare tensors with ``==`` (elementwise) on lookup.
_REDUCTIONS: dict[int, tuple[weakref.ref[torch.Tensor], Any, Any]] = {}


def _forget(dead: weakref.ref[torch.Tensor], identity: int) -> None:
    entry = _REDUCTIONS.get(identity)
    if entry is not None and entry[0] is dead:
        del _REDUCTIONS[identity]


def _reduce_tensor(candidate: Any) -> Any:
    """``reducer_override``: a plain tensor's cached reduction while its storage, offset, shape,
    strides, dtype and ``requires_grad`` are unchanged; anything else is pickled as usual."""
    if type(candidate) is not torch.Tensor or candidate.__dict__:
        return NotImplemented
    key = (
        candidate.data_ptr(),
        candidate.storage_offset(),
        candidate.shape,
        candidate.stride(),
        candidate.dtype,
        candidate.requires_grad,
        candidate.device,
    )
    identity = id(candidate)
    cached = _REDUCTIONS.get(identity)
    if cached is not None and cached[0]() is candidate and cached[1] == key:
        return cached[2]
    reduced = candidate.__reduce_ex__(DEFAULT_PROTOCOL)
    if isinstance(reduced, tuple) and reduced and reduced[0] is torch._utils._rebuild_tensor_v2:
        _REDUCTIONS[identity] = (weakref.ref(candidate, lambda dead: _forget(dead, identity)), key, reduced)
    return reduced


class _MetadataPickler(pickle.Pickler):
    reducer_override = staticmethod(_reduce_tensor)  # read once, when the pickler is made


class _Recorder:
    """The writer callback: keeps metadata bytes, turns placeholder reads into slot references."""

    def __init__(self, placeholder_address: int) -> None:
        self.placeholder_address = placeholder_address
        self.pieces: list[Piece] = []
        self.slot = -1
        self.slot_size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        length = view.nbytes
        if length == 0:
            return 0
        address = np.frombuffer(view, dtype=np.uint8).ctypes.data
        offset = address - self.placeholder_address
        if self.slot >= 0 and offset >= 0 and offset + length <= self.slot_size:
            self.pieces.append((self.slot, offset, length))
        elif self.pieces and isinstance(self.pieces[-1], bytes):
            self.pieces[-1] += bytes(view)
        else:
            self.pieces.append(bytes(view))
        return length


# Zip layouts by (length of data.pkl, storage sizes): without CRC-32 a file's zip structure
# depends on nothing else, and a training run saves the same layout every time. Each with its
# records (``zip_entries``), read once.
_LAYOUTS: dict[tuple[int, tuple[int, ...]], tuple[list[Piece], int, int, list[EntryCrc]]] = {}
_MAX_LAYOUTS = 64
_MARKER_MIN = 16


def _zip_pieces(pickled: bytes, sizes: list[int]) -> tuple[list[Piece], list[EntryCrc]]:
    """The pieces of a zip holding ``data.pkl`` = ``pickled`` and one record per storage size,
    and its records (``ckptlib._zipcrc.zip_entries``).

    The layout is made once per (``len(pickled)``, sizes) with a random stand-in for the pickle,
    and reused with this pickle put where the stand-in was.
    """
    key = (len(pickled), tuple(sizes))
    layout = _LAYOUTS.get(key)
    if layout is None:
        if len(pickled) < _MARKER_MIN:
            pieces = _record_zip_pieces(pickled, sizes)
            return pieces, zip_entries(pieces)
        marker = os.urandom(len(pickled))
        pieces = _record_zip_pieces(marker, sizes)
        where = [(index, piece.find(marker)) for index, piece in enumerate(pieces) if isinstance(piece, bytes)]
        found = [(index, position) for index, position in where if position >= 0]
        if len(found) != 1:  # not in one piece: no reusable layout
            pieces = _record_zip_pieces(pickled, sizes)
            return pieces, zip_entries(pieces)
        if len(_LAYOUTS) >= _MAX_LAYOUTS:
            _LAYOUTS.clear()
        layout = _LAYOUTS[key] = (pieces, *found[0], zip_entries(pieces))
    pieces, index, position, entries = layout
    template = pieces[index]
    assert isinstance(template, bytes)
    filled = list(pieces)
    filled[index] = template[:position] + pickled + template[position + len(pickled) :]
    return filled, entries


def _record_zip_pieces(pickled: bytes, sizes: list[int]) -> list[Piece]:
    largest = max([_PAGE, *sizes])
    placeholder_map = mmap.mmap(-1, (largest + _PAGE - 1) // _PAGE * _PAGE)
    placeholder = torch.frombuffer(placeholder_map, dtype=torch.uint8)
    recorder = _Recorder(placeholder.data_ptr())
    # torch's stub names IO[bytes]; its writer only calls ``write`` on the object it is given.
    writer = torch._C.PyTorchFileWriter(recorder, False, _PAGE)  # type: ignore[call-overload]
    writer.write_record("data.pkl", pickled, len(pickled))
    writer.write_record(".format_version", "1", len("1"))
    alignment = str(_PAGE)
    writer.write_record(".storage_alignment", alignment, len(alignment))
    writer.write_record("byteorder", sys.byteorder, len(sys.byteorder))
    for key, size in enumerate(sizes):
        recorder.slot, recorder.slot_size = key, size
        writer.write_record(f"data/{key}", placeholder[:size].untyped_storage() if size else b"", size)
        recorder.slot = -1
    writer.write_end_of_file()
    del writer, placeholder
    placeholder_map.close()
    return recorder.pieces
