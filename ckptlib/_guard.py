"""No silently wrong checkpoint: the lazily copied tensors' version counters.

``save`` leaves parameters and optimizer state in place (their bytes are written or copied in
the background until the next ``optimizer.step()``). Code that changes one of them in place
before its copy is taken (a ``torch.no_grad()`` ``add_``, ``load_state_dict`` of EMA weights,
which copies with ``copy_``, an edit of ``optimizer.state``) would leak into the checkpoint.
Every in-place torch operation bumps the tensor's version counter (``tensor._version``, shared
by its views and by ``detach()``), so ``save`` records each such tensor's version and the
checkpoint is *sealed* once every copy of it has been taken: if a version moved, the checkpoint
is not committed, a warning names the tensor, and the engine's later saves copy everything before
``save`` returns (``ckptlib._engine``).

Where a checkpoint is sealed: on the training thread at the optimizer's pre-step hook, at the
staging hook points, in ``save`` and in ``wait`` (every copy is taken there, and the training
thread is between two operations), else on the writer thread just before the commit. Not seen:
changes that bypass the version counter (through ``tensor.data``, a NumPy view, ``set_``
from C++), and changes made by another thread while a copy is being taken.

Copy modes (``CheckpointEngine(copy_mode=…)``, runtime_config ``copy_mode``):

* ``"checked"`` (default): lazy copy, sealed as above;
* ``"eager"``: every tensor is copied into the host cache before ``save`` returns;
* ``"lazy"``: upstream DataStates' model, unchecked: the caller must not change parameters or
  optimizer state between ``save`` and the next optimizer step.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch


def tensors_in(obj: Any, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a nested dict / list / tuple, with a dotted name (``state.0.exp_avg``)."""
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        for key, value in obj.items():
            yield from tensors_in(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from tensors_in(value, f"{prefix}.{index}" if prefix else str(index))


class VersionGuard:
    """The version of each tensor a checkpoint copies lazily, as ``save`` found it.

    ``seal`` compares them once (the first caller decides; later calls return the same answer)
    and lets the tensors go.
    """

    def __init__(self) -> None:
        self._entries: list[tuple[str, torch.Tensor, int]] = []
        self._lock = threading.Lock()
        self._decided = False
        self._changed: str | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, label: str, tensor: torch.Tensor) -> None:
        self._entries.append((label, tensor, tensor._version))

    def seal(self, on_change: Callable[[str], None] | None = None) -> str | None:
        """None when no recorded tensor changed since ``save``; else the first one's name.

        The first call decides; ``on_change`` runs then, under the guard's lock, so a caller that
        finds the guard decided also finds what ``on_change`` recorded (the job's error).
        """
        with self._lock:
            if not self._decided:
                self._decided = True
                for label, tensor, version in self._entries:
                    if tensor._version != version:
                        self._changed = label
                        break
                self._entries = []
                if self._changed is not None and on_change is not None:
                    on_change(self._changed)
            return self._changed


def guard_object(guard: VersionGuard, file_name: str, obj: Any, live: set[int] | None) -> None:
    """Records the tensors of ``obj`` (a ``.pt`` file's object) whose storage stays live."""
    # One walk of plain dicts, lists and tuples without a generator per level: it runs in every
    # save (and every per-step snapshot) over an optimizer's state.
    pending: list[tuple[str, Any]] = [("", obj)]
    while pending:
        prefix, value = pending.pop()
        kind = type(value)
        if kind is dict or kind is list or kind is tuple:
            items = value.items() if kind is dict else enumerate(value)
            children = [(f"{prefix}.{key}" if prefix else str(key), child) for key, child in items if type(child) not in _LEAVES]
            pending.extend(reversed(children))  # depth first, in order: the first change is named
        elif isinstance(value, torch.Tensor):
            if live is None or value.untyped_storage().data_ptr() in live:
                guard.add(f"{file_name}: {prefix}", value)
        elif isinstance(value, (Mapping, list, tuple)):
            for name, tensor in tensors_in(value, prefix):
                if live is None or tensor.untyped_storage().data_ptr() in live:
                    guard.add(f"{file_name}: {name}", tensor)


# Values with no tensor inside, skipped without a look.
_LEAVES = frozenset({int, float, bool, str, bytes, type(None)})
