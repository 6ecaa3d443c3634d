"""Where training lets the engine stage: hooks on the training thread.

``StagingPoints.watch(optimizer)`` hooks the optimizer's step (before it, everything left is
staged: the step is the only thing that changes parameters and optimizer state);
``follow_staging`` hooks its parameters' gradient accumulation and every module's forward pass
(a little is staged at each) while a checkpoint has bytes left to hand over there, and takes
them off again once none has. ``remove`` takes every hook off (shutdown).

The forward pre-hook and the pre-step hook are also where a pending SIGTERM may be served
(``ckptlib._signals.at_hook_point``): both run between whole steps.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from typing import Any

import torch

import ckptlib._signals as _signals
from ckptlib._events import LOG_PREFIX
from ckptlib._inflight import InFlightBook
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
            except Exception:  # a checkpoint must never break the training step
                logger.exception("%s staging failed", LOG_PREFIX)

    def __reduce__(self) -> tuple[Any, ...]:
        return (StagingHook, (None,), {"_force": self._force, "_kind": self._kind})


class StagingPoints:
    """The hooks one engine installed, and the staging they run.

    The optimizer's pre-step hook stays from ``watch`` until ``remove``. The ordinary points
    (every module's forward pre-hook, each watched parameter's gradient accumulation) are
    installed only while a checkpoint has bytes left to hand over at them
    (``follow_staging``), and the forward pre-hook also while ``keep_forward()`` says a pending
    SIGTERM needs it as a safe point: a registered global module hook sends every module call
    of the model through ``torch.nn.Module``'s slow path, a cost paid at every step.

    Args:
        stager: Stages the checkpoints in flight.
        jobs: The engine's jobs (the oldest unstaged one is charged the time a hook blocks).
        keep_forward: Whether the forward pre-hook must stay as a safe point for signals.
        after_stage: Called with ``force`` after each hook point's staging, even with nothing
            to stage.
    """

    def __init__(
        self,
        stager: Stager,
        jobs: InFlightBook,
        *,
        keep_forward: Callable[[], bool] = lambda: False,
        after_stage: Callable[[bool], None] = lambda _force: None,
    ) -> None:
        self._stager = stager
        self._after_stage = after_stage
        self._jobs = jobs
        self._keep_forward = keep_forward
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()
        self._step_handles: list[Any] = []
        self._forward_handle: Any = None
        self._grad_handles: list[Any] = []
        self._grad_hooked: weakref.WeakSet[Any] = weakref.WeakSet()

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Hooks ``optimizer``'s step (once); its parameters' gradient accumulation is hooked
        while a checkpoint needs ordinary points."""
        optimizer = unwrap_optimizer(optimizer) or optimizer
        if optimizer in self._hooked:
            return
        self._hooked.add(optimizer)
        self._step_handles.append(optimizer.register_step_pre_hook(StagingHook(self, force=True, kind="pre-step")))
        if self._grad_handles:
            self._hook_gradients()

    def watches_an_optimizer(self) -> bool:
        return any(isinstance(candidate, torch.optim.Optimizer) for candidate in self._hooked)

    def watched_optimizers(self) -> list[torch.optim.Optimizer]:
        return [candidate for candidate in self._hooked if isinstance(candidate, torch.optim.Optimizer)]

    def hook_forward_passes(self) -> None:
        """Hooks every module's forward pass (once)."""
        if self._forward_handle is None:
            hook = StagingHook(self, force=False, kind="forward")
            self._forward_handle = torch.nn.modules.module.register_module_forward_pre_hook(hook)

    def follow_staging(self) -> None:
        """Installs the ordinary points while a checkpoint has bytes left to hand over at them,
        removes them once none has (called on the training thread, never from inside a
        forward or gradient hook)."""
        if self._stager.handed_over:
            if self._grad_handles:
                for handle in self._grad_handles:
                    handle.remove()
                self._grad_handles.clear()
                self._grad_hooked = weakref.WeakSet()
            if self._forward_handle is not None and not self._keep_forward():
                self._forward_handle.remove()
                self._forward_handle = None
        else:
            self.hook_forward_passes()
            self._hook_gradients()

    def _hook_gradients(self) -> None:
        for optimizer in self.watched_optimizers():
            for group in optimizer.param_groups:
                for parameter in group["params"]:
                    if parameter.requires_grad and parameter not in self._grad_hooked:
                        self._grad_hooked.add(parameter)
                        hook = StagingHook(self, force=False)
                        self._grad_handles.append(parameter.register_post_accumulate_grad_hook(hook))

    def stage(self, *, force: bool) -> None:
        """Stages what it may now (``force``: everything left), at a hook point; then
        ``after_stage(force)`` (the engine seals the checkpoints whose copies are all taken)."""
        if not self._stager.idle:
            pending = self._jobs.unstaged()
            began = time.perf_counter()
            if self._stager.run(force=force) and pending:
                pending[0].blocking_s += time.perf_counter() - began
            if force:
                self.follow_staging()  # the pre-step hook: outside any forward or backward
        self._after_stage(force)

    def remove(self) -> None:
        handles = [*self._step_handles, *self._grad_handles]
        if self._forward_handle is not None:
            handles.append(self._forward_handle)
        for handle in handles:
            handle.remove()
        self._step_handles.clear()
        self._grad_handles.clear()
        self._forward_handle = None
