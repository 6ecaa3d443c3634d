"""Reading a committed checkpoint back (plain API ``load``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import ckptlib._format as _format
from ckptlib._dist import ProcessPlace
from ckptlib._types import CheckpointError, LoadedCheckpoint

_SAFETENSORS_CODES = {code: dtype for dtype, code in _format._SAFETENSORS_DTYPES.items()}


def read_checkpoint(directory: Path, *, place: ProcessPlace, map_location: str | torch.device) -> LoadedCheckpoint:
    """Loads every file this rank needs from a committed checkpoint.

    Returns:
        The checkpoint.

    Raises:
        CheckpointError: The directory is not a committed checkpoint.
    """
    try:
        manifest = _format.read_manifest(directory)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{directory} is not a committed checkpoint: {error}") from error
    state: dict[str, Any] = {}
    for key, name in dict(manifest["keys"]).items():
        if key == "rng_state":
            name = _format.rng_file_name(place.rank, int(manifest["world_size"]))
        path = directory / name
        if not path.is_file():
            continue
        if name.endswith(".safetensors"):
            state[key] = read_safetensors(path)
        else:
            # Our own files, written by this library: they hold numpy RNG arrays and plain objects.
            state[key] = torch.load(path, map_location=map_location, weights_only=False)
    return LoadedCheckpoint(step=int(manifest["step"]), path=directory, state=state)


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Reads a safetensors file with torch alone (no ``safetensors`` package needed)."""
    data = bytearray(path.read_bytes())
    header_len = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + header_len])
    header.pop("__metadata__", None)
    base = 8 + header_len
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = _SAFETENSORS_CODES[entry["dtype"]]
        raw = torch.frombuffer(data, dtype=torch.uint8, offset=base + begin, count=end - begin) if end > begin else torch.empty(0, dtype=torch.uint8)
        tensors[name] = raw.view(dtype).reshape(entry["shape"]).clone()
    return tensors
