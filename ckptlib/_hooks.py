"""Where training lets the engine stage: hooks on the training thread.

``StagingPoints.watch(optimizer)`` hooks the optimizer's step (before it, everything left is
staged: the step is the only thing that changes parameters and optimizer state) and its
parameters' gradient accumulation (a little is staged); ``hook_forward_passes`` hooks every
module's forward pass (a little). ``remove`` takes every hook off again (shutdown).

The forward pre-hook and the pre-step hook are also where a pending SIGTERM may be served
(``ckptlib._signals.at_hook_point``): both run between whole steps.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import Any

import torch

import ckptlib._signals as _signals
from ckptlib._events import LOG_PREFIX
from ckptlib._jobs import JobBook
from ckptlib._plan import unwrap_optimizer
from ckptlib._stage import Stager

logger = logging.getLogger(__name__)


class StagingHook:
    """A hook that lets the engine stage a little (or, ``force``, everything left).

    ``kind`` (``"forward"``, ``"pre-step"``, ``"grad"``) says where it runs; the first two are
    safe points for a pending SIGTERM. It holds its ``StagingPoints`` weakly, and pickles and copies as a no-op, so models and
    optimizers carrying it stay picklable.
    """

    def __init__(self, points: StagingPoints | None, *, force: bool = False, kind: str = "grad") -> None:
        self._points = weakref.ref(points) if points is not None else None
        self._force = force
        self._kind = kind

    def __call__(self, *_args: Any, **_kwargs: Any) -> None:
        points = self._points() if self._points is not None else None
        if points is not None:
            if self._kind != "grad":
                # May take the final checkpoint and raise SystemExit (not caught below).
                _signals.at_hook_point(kind=self._kind)
            try:
                points.stage(force=self._force)
            except Exception:  # noqa: BLE001 - a checkpoint must never break the training step
                logger.exception("%s staging failed", LOG_PREFIX)

    def __reduce__(self) -> tuple[Any, ...]:
        return (StagingHook, (None,), {"_force": self._force, "_kind": self._kind})


class StagingPoints:
    """The hooks one engine installed, and the staging they run.

    Args:
        stager: Stages the checkpoints in flight.
        jobs: The engine's jobs (the oldest unstaged one is charged the time a hook blocks).
    """

    def __init__(self, stager: Stager, jobs: JobBook) -> None:
        self._stager = stager
        self._jobs = jobs
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()
        self._hooked_points: set[str] = set()
        self._handles: list[Any] = []

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Hooks ``optimizer``'s step and its parameters' gradient accumulation (once)."""
        optimizer = unwrap_optimizer(optimizer) or optimizer
        if optimizer in self._hooked:
            return
        self._hooked.add(optimizer)
        self._handles.append(optimizer.register_step_pre_hook(StagingHook(self, force=True, kind="pre-step")))
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.requires_grad and parameter not in self._hooked:
                    self._hooked.add(parameter)
                    hook = StagingHook(self, force=False)
                    self._handles.append(parameter.register_post_accumulate_grad_hook(hook))

    def watches_an_optimizer(self) -> bool:
        return any(isinstance(candidate, torch.optim.Optimizer) for candidate in self._hooked)

    def watched_optimizers(self) -> list[torch.optim.Optimizer]:
        return [candidate for candidate in self._hooked if isinstance(candidate, torch.optim.Optimizer)]

    def hook_forward_passes(self) -> None:
        """Hooks every module's forward pass (once)."""
        if "forward" not in self._hooked_points:
            self._hooked_points.add("forward")
            hook = StagingHook(self, force=False, kind="forward")
            self._handles.append(torch.nn.modules.module.register_module_forward_pre_hook(hook))

    def stage(self, *, force: bool) -> None:
        """Stages what it may now (``force``: everything left), at a hook point."""
        if self._stager.idle:
            return
        pending = self._jobs.unstaged()
        began = time.perf_counter()
        if self._stager.run(force=force) and pending:
            pending[0].blocking_s += time.perf_counter() - began

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
