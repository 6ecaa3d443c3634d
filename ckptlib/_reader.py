"""Reading a committed checkpoint back (plain API ``load``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

import ckptlib._format as _format
from ckptlib._dist import ProcessPlace
from ckptlib._layout import damage_of
from ckptlib._types import CheckpointError, LoadedCheckpoint

_SAFETENSORS_CODES = {code: dtype for dtype, code in _format._SAFETENSORS_DTYPES.items()}


def read_checkpoint(directory: Path, *, place: ProcessPlace, map_location: str | torch.device) -> LoadedCheckpoint:
    """Loads every file this rank needs from a committed checkpoint.

    Returns:
        The checkpoint.

    Raises:
        CheckpointError: The directory is not a committed checkpoint, or one of its files is
            damaged or cannot be read (the message names it).
    """
    try:
        manifest = _format.read_manifest(directory)
    except (OSError, ValueError) as error:
        raise CheckpointError(f"{directory / _format.MANIFEST_NAME}: not a committed checkpoint's manifest: {error}") from error
    problem = damage_of(directory)
    if problem is not None:
        raise CheckpointError(f"damaged checkpoint: {problem}")
    try:
        keys = {str(key): str(name) for key, name in dict(manifest["keys"]).items()}
        step = int(manifest["step"])
        world_size = int(manifest["world_size"]) if "rng_state" in keys else 1
    except (KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{directory / _format.MANIFEST_NAME}: the manifest's {error} is missing or not what ckptlib writes") from error
    state: dict[str, Any] = {}
    for key, name in keys.items():
        if key == "rng_state":
            name = _format.rng_file_name(place.rank, world_size)
        path = directory / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                state[key] = read_safetensors(path)
            else:
                # Our own files, written by this library: they hold numpy RNG arrays and plain objects.
                state[key] = torch.load(path, map_location=map_location, weights_only=False)
        except Exception as error:  # any reader error: the file is named
            raise CheckpointError(f"cannot read {path}: {error}") from error
    return LoadedCheckpoint(step=step, path=directory, state=state)


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


def check_fits(state: dict[str, Any], into: Any, where: Path) -> None:
    """Raises before anything is loaded when a checkpoint's entry does not fit its target: a
    module's keys or tensor shapes, an optimizer's groups or per-parameter state shapes.

    Raises:
        CheckpointError: What does not fit, naming the checkpoint and the key.
    """
    for key, target in into.items():
        if key not in state or not hasattr(target, "load_state_dict"):
            continue
        saved = state[key]
        if isinstance(target, torch.nn.Module):
            current = target.state_dict()
            if set(current) != set(saved):
                missing, extra = sorted(set(current) - set(saved)), sorted(set(saved) - set(current))
                raise CheckpointError(f"{where}: {key!r} does not fit: missing {missing[:5]}, unexpected {extra[:5]}")
            for name, tensor in current.items():
                other = saved[name]
                if isinstance(tensor, torch.Tensor) and tuple(other.shape) != tuple(tensor.shape):
                    raise CheckpointError(f"{where}: {key}.{name} has shape {tuple(other.shape)}, the model's is {tuple(tensor.shape)}")
        elif isinstance(target, torch.optim.Optimizer):
            _check_optimizer_fits(key, target, saved, where)


def _check_optimizer_fits(key: str, optimizer: torch.optim.Optimizer, saved: Any, where: Path) -> None:
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(groups, list) or len(groups) != len(optimizer.param_groups):
        raise CheckpointError(f"{where}: {key!r} has another number of parameter groups than the optimizer")
    params: dict[Any, torch.Tensor] = {}
    for group, mine in zip(groups, optimizer.param_groups, strict=True):
        if len(group.get("params", ())) != len(mine["params"]):
            raise CheckpointError(f"{where}: {key!r} has a parameter group of another size than the optimizer's")
        params.update(zip(group["params"], mine["params"], strict=True))
    for index, per_parameter in dict(saved.get("state", {})).items():
        parameter = params.get(index)
        if parameter is None or not isinstance(per_parameter, dict):
            continue
        for name, value in per_parameter.items():
            if isinstance(value, torch.Tensor) and value.dim() == parameter.dim() and value.numel() > 1 and tuple(value.shape) != tuple(parameter.shape):
                raise CheckpointError(f"{where}: {key}.state.{index}.{name} has shape {tuple(value.shape)}, its parameter {tuple(parameter.shape)}")
