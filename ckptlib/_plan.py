"""Turning a training state into files to write: which tensors, which copies must happen now.

A state maps keys to live objects. Each key becomes one file named as the Trainer names it:
a module → ``<key>.safetensors`` (``model.safetensors``), anything else → ``<key>.pt``
(``optimizer.pt``, ``scheduler.pt``, ``scaler.pt``). Each file is planned as its bytes in order
(``pieces``): headers and metadata as bytes made now, tensor bytes as references to live tensors
that staging (``ckptlib._stage``) writes or copies before the next optimizer step. With an optimizer in
the state, only module parameters and optimizer state are left to staging (nothing else changes
them); everything else is copied inside ``save``, because forward or user code may change it
at any time: module buffers (BatchNorm statistics), the tensors of a module no optimizer in the
state steps (an EMA copy updated after ``save``), an optimizer's ``param_groups`` (a tensor
learning rate that ``scheduler.step()`` changes in place), schedulers and plain values. Only
tensors whose storage belongs to a parameter or a state tensor of an optimizer in the state
(``protected_storages``) stay live. Without an optimizer, everything is left to staging and
``save`` waits for it.
"""

from __future__ import annotations

import copy
import io
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

import ckptlib._format as _format
from ckptlib._cache import PAGE as _PAGE
from ckptlib._guard import VersionGuard, guard_object
from ckptlib._torchfile import Piece, streamed_pieces
from ckptlib._zipcrc import EntryCrc


@dataclass(eq=False)
class Slot:
    """One tensor whose bytes go into a file: the live tensor until it is staged."""

    source: torch.Tensor | None
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
    """One file of a checkpoint: its bytes in order, as pieces.

    Attributes:
        name: File name inside the checkpoint directory.
        slots: The tensors the pieces refer to (staged in the background).
        pieces: The file's bytes in order.
        crcs: Zip entries whose CRC-32 the writers compute (``ckptlib._zipcrc``).
    """

    name: str
    slots: list[Slot]
    pieces: list[Piece]
    crcs: list[EntryCrc] = field(default_factory=list)

    @property
    def size(self) -> int:
        return sum(len(piece) if isinstance(piece, bytes) else piece[2] for piece in self.pieces)


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
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def restore_rng_state(states: Mapping[str, Any]) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.random.set_rng_state(states["cpu"])
    if "cuda" in states and torch.cuda.is_available():
        cuda_states = states["cuda"]
        if isinstance(cuda_states, torch.Tensor):
            torch.cuda.random.set_rng_state(cuda_states)
        else:
            torch.cuda.random.set_rng_state_all(cuda_states)


def file_name_for(key: str, value: Any, *, rank: int, sharded: bool, state_dict: Mapping[str, Any] | None = None) -> str:
    stem = key if not sharded else f"{key}_rank{rank}"
    return f"{stem}.safetensors" if _is_flat_module(value, state_dict) else f"{stem}.pt"


def plan_state(
    state: Mapping[str, Any],
    *,
    rank: int,
    world_size: int,
    write_state: bool,
    sharded: bool,
    capture_rng: bool,
    mem_align: int = _PAGE,
    guard: VersionGuard | None = None,
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
        mem_align: The direct-I/O memory alignment where the files go
            (``ckptlib._writer.memory_alignment``): ``.safetensors`` files are laid out for it.
        guard: Records the version of every tensor left live (``ckptlib._guard``).

    Returns:
        The files; only background tensors are left to copy.
    """
    plan = StatePlan()
    optimizers = [opt for value in state.values() if (opt := unwrap_optimizer(value)) is not None]
    # None: no optimizer step to wait for, so everything is staged before save returns.
    protected = protected_storages(optimizers) if optimizers else None
    plan.optimizers = optimizers
    if write_state:
        for key, value in state.items():
            # A module's state_dict, made once (naming the file and planning it both need it).
            module_state = value.state_dict() if isinstance(value, torch.nn.Module) else None
            name = file_name_for(key, value, rank=rank, sharded=sharded, state_dict=module_state)
            plan.keys[key] = name
            plan.files.append(_plan_value(name, value, protected=protected, state_dict=module_state, mem_align=mem_align, guard=guard))
    if capture_rng:
        name = _format.rng_file_name(rank, world_size)
        plan.keys["rng_state"] = name
        # Streamed: the state is a fresh copy that nothing changes, and its pickle is reused
        # while the Python and NumPy states are unchanged (``ckptlib._torchfile``).
        plan.files.append(plan_object(name, capture_rng_state(), background=True))
    return plan


def _is_flat_module(value: Any, state_dict: Mapping[str, Any] | None = None) -> bool:
    if not isinstance(value, torch.nn.Module):
        return False
    if state_dict is None:
        state_dict = value.state_dict()
    return all(isinstance(v, torch.Tensor) for v in state_dict.values())


def protected_storages(optimizers: list[torch.optim.Optimizer], modules: tuple[Any, ...] = ()) -> set[int]:
    """Storage addresses that only an optimizer step changes: the optimizers' parameters and
    per-parameter state (``exp_avg``, ``step``, …), and the parameters of ``modules`` that such a
    step updates (DeepSpeed's module parameters, copied from its flat partitions in its step)."""
    protected: set[int] = set()
    for optimizer in optimizers:
        optimizer = unwrap_optimizer(optimizer) or optimizer
        for group in optimizer.param_groups:
            protected.update(_storage_address(p) for p in group["params"] if isinstance(p, torch.Tensor))
        for per_parameter in optimizer.state.values():
            if isinstance(per_parameter, Mapping):
                protected.update(_storage_address(t) for t in per_parameter.values() if isinstance(t, torch.Tensor))
    for module in modules:
        protected.update(_storage_address(p) for p in module.parameters())
    return protected


def _storage_address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _plan_value(
    name: str,
    value: Any,
    *,
    protected: set[int] | None,
    state_dict: Mapping[str, Any] | None = None,
    mem_align: int = _PAGE,
    guard: VersionGuard | None = None,
) -> FilePlan:
    if name.endswith(".safetensors"):
        slots, names, live = [], [], []
        for tensor_name, tensor in (state_dict if state_dict is not None else value.state_dict()).items():
            # Buffers and tensors no optimizer here steps (an EMA module) may change before the
            # next optimizer step: copy them now.
            background = protected is None or _storage_address(tensor) in protected
            if background and guard is not None:
                guard.add(f"{name}: {tensor_name}", tensor)
            slots.append(Slot(source=tensor.detach() if background else tensor.detach().clone()))
            names.append(tensor_name)
            live.append(background)
        header = _format.safetensors_header(
            ((tensor_name, slot.dtype, slot.shape, slot.nbytes) for tensor_name, slot in zip(names, slots, strict=True)),
            residue=_data_residue(slots, live, mem_align),
        )
        pieces: list[Piece] = [header, *((index, 0, slot.nbytes) for index, slot in enumerate(slots) if slot.nbytes)]
        return FilePlan(name=name, slots=slots, pieces=pieces)
    if unwrap_optimizer(value) is not None:
        state_dict = value.state_dict()
        if protected is not None and "param_groups" in state_dict:
            # Hyper-parameters may be tensors a scheduler changes in place (a tensor lr).
            state_dict = {**state_dict, "param_groups": copy.deepcopy(state_dict["param_groups"])}
        if guard is not None:
            guard_object(guard, name, state_dict, protected)
        return plan_object(name, state_dict, background=True, protected=protected)
    if state_dict is not None:
        return plan_object(name, state_dict, background=protected is None)
    if hasattr(value, "state_dict") and callable(value.state_dict):
        return plan_object(name, value.state_dict(), background=protected is None)
    return plan_object(name, value, background=protected is None)


def _data_residue(slots: list[Slot], live: list[bool], mem_align: int) -> int:
    """Where a ``.safetensors`` file's tensor data should start, modulo a page, so that most
    bytes of the tensors staging may write straight from memory sit as far from a ``mem_align``
    boundary in the file as in memory (``ckptlib._stage``: a direct write needs both aligned).

    Tensors are written back to back (the format allows no gap), so one start serves them all;
    the class of starts (modulo ``mem_align``) that aligns the most bytes wins, and within it
    the start that also puts the most bytes at their memory's offset from a page (their first
    page boundary is then the same in both: the least is copied). A model loaded by
    ``from_pretrained`` (transformers 5.24) has its tensors 8 or 2056 bytes past a page
    boundary: with the data at a page boundary none of them could be written from memory.
    A multiple of 8 (readers may view the data as 8-byte values); 0 when nothing can be aligned.
    """
    by_page: dict[int, int] = {}
    position = 0
    for slot, candidate in zip(slots, live, strict=True):
        source = slot.source
        if candidate and source is not None and source.device.type == "cpu" and source.is_contiguous():
            residue = (source.data_ptr() - position) % _PAGE
            if residue % 8 == 0:
                by_page[residue] = by_page.get(residue, 0) + slot.nbytes
        position += slot.nbytes
    if not by_page:
        return 0
    unit = min(max(mem_align, 1), _PAGE)
    by_class: dict[int, int] = {}
    for residue, nbytes in by_page.items():
        by_class[residue % unit] = by_class.get(residue % unit, 0) + nbytes
    best = max(by_class, key=by_class.__getitem__)
    return max((r for r in by_page if r % unit == best), key=by_page.__getitem__)


def plan_object(name: str, obj: Any, *, background: bool, protected: set[int] | None = None) -> FilePlan:
    """A ``.pt`` file: streamed storage by storage when ``background``, else serialized now.

    Args:
        name: File name.
        obj: What ``torch.save`` would be given.
        background: Stream its storages (staged later) instead of serializing now.
        protected: With ``background``: the storages that may stay live until the next
            optimizer step (``protected_storages``); the others are copied now. None: all live.
    """
    if background:
        streamed = streamed_pieces(obj)
        if streamed is not None:
            sources, pieces, crcs = streamed
            if protected is not None:
                sources = [s if s.data_ptr() in protected else s.clone() for s in sources]
            return FilePlan(name=name, slots=[Slot(source=s) for s in sources], pieces=pieces, crcs=crcs)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return FilePlan(name=name, slots=[], pieces=[buffer.getvalue()])
