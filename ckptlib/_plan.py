"""Turning a training state into files to write: which tensors, which copies must happen now.

A state maps keys to live objects. Each key becomes one file named as the Trainer names it:
a module → ``<key>.safetensors`` (``model.safetensors``), anything else → ``<key>.pt``
(``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``). Tensors that only an optimizer step changes
(module parameters, optimizer state) are staged in the background; everything else is copied
inside ``save`` because forward or user code may change it at any time.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptlib import _format


class TensorRef:
    """Where a staged tensor goes back into a skeleton."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


@dataclass(eq=False)
class Slot:
    """One tensor to stage: the live source until staged, then its host copy until written."""

    source: torch.Tensor | None
    synchronous: bool
    staged: torch.Tensor | None = None
    buffer: torch.Tensor | None = None
    dtype: torch.dtype = field(init=False)
    shape: tuple[int, ...] = field(init=False)
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        assert self.source is not None
        self.dtype = self.source.dtype
        self.shape = tuple(self.source.shape)
        self.nbytes = self.source.numel() * self.source.element_size()


@dataclass(eq=False)
class FilePlan:
    """One file of a checkpoint.

    Attributes:
        name: File name inside the checkpoint directory.
        slots: Tensors in the order their bytes are written.
        skeleton: The object with ``TensorRef`` in place of tensors (``.pt`` files).
        tensor_names: Safetensors names aligned with ``slots`` (``.safetensors`` files), else None.
    """

    name: str
    slots: list[Slot]
    skeleton: Any = None
    tensor_names: list[str] | None = None
    pickled: bytes | None = None
    storage_order: list[int] | None = None
    staged_count: int = 0

    @property
    def written_whole(self) -> bool:
        """Whether the file needs all its tensors staged before its first byte is written."""
        return self.tensor_names is None and self.pickled is None

    @property
    def nbytes(self) -> int:
        return sum(slot.nbytes for slot in self.slots)

    def rebuild(self) -> Any:
        """The skeleton with staged tensors in place of the references."""
        return _fill(self.skeleton, self.slots)


@dataclass
class StatePlan:
    files: list[FilePlan] = field(default_factory=list)
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    keys: dict[str, str] = field(default_factory=dict)


def unwrap_optimizer(candidate: Any) -> torch.optim.Optimizer | None:
    """The torch optimizer inside wrappers such as accelerate's ``AcceleratedOptimizer``.

    Such wrappers subclass ``Optimizer`` without its hook tables, so the innermost one is taken.
    """
    for _ in range(5):
        inner = getattr(candidate, "optimizer", None)
        if inner is None:
            break
        candidate = inner
    return candidate if isinstance(candidate, torch.optim.Optimizer) else None


def capture_rng_state() -> dict[str, Any]:
    """The RNG states the Trainer saves in ``rng_state*.pth``."""
    import numpy as np

    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def restore_rng_state(states: Mapping[str, Any]) -> None:
    import numpy as np

    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        cuda_states = states["cuda"]
        if isinstance(cuda_states, torch.Tensor):
            torch.cuda.random.set_rng_state(cuda_states)
        else:
            torch.cuda.random.set_rng_state_all(cuda_states)


def file_name_for(key: str, value: Any, *, rank: int, sharded: bool) -> str:
    stem = key if not sharded else f"{key}_rank{rank}"
    return f"{stem}.safetensors" if _is_flat_module(value) else f"{stem}.pt"


def plan_state(
    state: Mapping[str, Any],
    *,
    rank: int,
    world_size: int,
    write_state: bool,
    sharded: bool,
    capture_rng: bool,
) -> StatePlan:
    """Decides the files of one rank's part of a checkpoint.

    Args:
        state: Keys to live objects (modules, optimizers, schedulers, tensors, plain values).
        rank: This process's global rank.
        world_size: Processes in the job.
        write_state: Whether this rank writes ``state`` (rank 0 for replicated state, every rank
            when sharded); other ranks write only their RNG state.
        sharded: Whether every rank holds different state (file names get ``_rank<r>``).
        capture_rng: Also write ``rng_state.pth`` / ``rng_state_<rank>.pth``.

    Returns:
        The files, with tensors not yet copied except the synchronous ones' sources marked.
    """
    plan = StatePlan()
    optimizers = [opt for value in state.values() if (opt := unwrap_optimizer(value)) is not None]
    guarded = bool(optimizers)
    plan.optimizers = optimizers
    if write_state:
        for key, value in state.items():
            name = file_name_for(key, value, rank=rank, sharded=sharded)
            plan.keys[key] = name
            plan.files.append(_plan_value(name, value, guarded=guarded))
    if capture_rng:
        name = _format.rng_file_name(rank, world_size)
        plan.keys["rng_state"] = name
        plan.files.append(_plan_object(name, capture_rng_state(), synchronous=True))
    return plan


def _is_flat_module(value: Any) -> bool:
    if not isinstance(value, torch.nn.Module):
        return False
    return all(isinstance(v, torch.Tensor) for v in value.state_dict().values())


def _plan_value(name: str, value: Any, *, guarded: bool) -> FilePlan:
    if name.endswith(".safetensors"):
        parameter_ptrs = {p.data_ptr() for p in value.parameters()}
        slots, names = [], []
        for tensor_name, tensor in value.state_dict().items():
            # Buffers (BatchNorm statistics) change in forward: copy them now.
            background = guarded and tensor.data_ptr() in parameter_ptrs
            slots.append(Slot(source=tensor, synchronous=not background))
            names.append(tensor_name)
        return FilePlan(name=name, slots=slots, tensor_names=names)
    if unwrap_optimizer(value) is not None:
        return _plan_object(name, value.state_dict(), synchronous=False)
    if hasattr(value, "state_dict") and callable(value.state_dict):
        return _plan_object(name, value.state_dict(), synchronous=True)
    return _plan_object(name, value, synchronous=True)


def _plan_object(name: str, obj: Any, *, synchronous: bool) -> FilePlan:
    slots: list[Slot] = []
    seen: dict[int, int] = {}
    skeleton = _strip(obj, slots, seen, synchronous)
    plan = FilePlan(name=name, slots=slots, skeleton=skeleton)
    if not synchronous:
        from ckptlib._torchfile import pickle_metadata

        streamed = pickle_metadata(obj, slots)
        if streamed is not None:
            plan.pickled, plan.storage_order = streamed
    return plan


def _strip(obj: Any, slots: list[Slot], seen: dict[int, int], synchronous: bool) -> Any:
    if isinstance(obj, torch.Tensor):
        index = seen.get(id(obj))
        if index is None:
            index = seen[id(obj)] = len(slots)
            slots.append(Slot(source=obj, synchronous=synchronous))
        return TensorRef(index)
    if isinstance(obj, dict):
        stripped = {k: _strip(v, slots, seen, synchronous) for k, v in obj.items()}
        return type(obj)(stripped) if type(obj) is not dict else stripped
    if isinstance(obj, list):
        return [_strip(v, slots, seen, synchronous) for v in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return tuple(_strip(v, slots, seen, synchronous) for v in obj)
    # Plain values (lr floats, step ints, numpy RNG arrays) are frozen now.
    return copy.deepcopy(obj)


def _fill(skeleton: Any, slots: list[Slot]) -> Any:
    if isinstance(skeleton, TensorRef):
        return slots[skeleton.index].staged
    if isinstance(skeleton, dict):
        filled = {k: _fill(v, slots) for k, v in skeleton.items()}
        return type(skeleton)(filled) if type(skeleton) is not dict else filled
    if isinstance(skeleton, list):
        return [_fill(v, slots) for v in skeleton]
    if isinstance(skeleton, tuple) and not hasattr(skeleton, "_fields"):
        return tuple(_fill(v, slots) for v in skeleton)
    return skeleton
