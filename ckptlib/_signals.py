"""SIGTERM (Spot reclaim, stop) and interpreter exit: one final checkpoint, taken at a safe point.

The guarantee:

* **The handler never touches state.** ``_on_sigterm`` only records the request (and the grace
  deadline) and sets ``stop_requested`` on every engine. A signal lands between any two bytecodes,
  including inside ``optimizer.step()`` with half the parameters updated, or while the
  interrupted code holds the stager's lock: nothing there is consistent enough to save.
* **The final checkpoint is taken at the next safe point** on the main thread, before the grace
  deadline (``grace_period_s`` after the signal):

  - with an integration that owns the step boundary (the Trainer: ``defer_final_checkpoint``), at
    the end of the step (``DecoratedCheckpointing``'s callback, all ranks agreeing);
  - otherwise, at an explicit ``ckptlib.safe_point()`` call (the end of the user's step). Once a
    script has called ``safe_point()``, only those calls are safe points;
  - in a script that never calls it, at the forward pre-hook of the first outermost module call
    after an optimizer step (or before the first one). Not a nested module's call (the outer
    forward may already have updated BatchNorm statistics), not a later forward of the same step
    (gradient accumulation: the first micro-batch updated them), and not the optimizer's pre-step
    hook (the step's forward already did). There, ``final_state()`` must return the state and
    the number of optimizer steps it holds: a loop that counts its step right after
    ``optimizer.step()`` / ``scheduler.step()`` does. A loop that runs other forwards between the
    optimizer step and its count (evaluation), or watches no optimizer before the signal, should
    call ``safe_point()``.

  The final checkpoint is ``final_state()`` read at that point; it persists within what is left
  of the grace period, then the process exits with status 143. A signal that lands inside
  ``optimizer.step()`` of step N+1 yields the checkpoint of step N+1, taken after that step
  finished, never a mix.
* **If training reaches no safe point before the deadline** (blocked in I/O, a collective, a long
  evaluation), nothing new is saved: the checkpoints already in flight go on committing in the
  background until the deadline, then the process exits with status 143 and the last committed
  checkpoint stands.
* **At interpreter exit** the final checkpoint is taken only when the program ends normally and no
  SIGTERM is still unserved: an exit through an unhandled exception (which may have left a step
  half done) only waits for the checkpoints in flight.

A previous SIGTERM handler (the user's own) is called at the safe point, after the final
checkpoint, in ordinary context.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
import time
import weakref
from types import FrameType
from typing import Any, Protocol

from ckptlib._config import RuntimeConfig

logger = logging.getLogger(__name__)

SIGTERM_EXIT_STATUS = 128 + signal.SIGTERM
# After a served request's deadline, how long the exit may still take before it is forced.
_STUCK_MARGIN_S = 10.0


class SignalledEngine(Protocol):
    """What the handlers need of ``ckptlib.CheckpointEngine`` (named here, not imported: the
    engine imports this module)."""

    options: RuntimeConfig
    stop_requested: threading.Event
    defer_final_checkpoint: bool

    def final_checkpoint(self, *, deadline: float | None = None) -> None: ...

    def shutdown(self, *, timeout: float | None = None) -> None: ...


class _StopRequest:
    """The recorded SIGTERM: written by the handler, served at the next safe point."""

    def __init__(self) -> None:
        self.deadline: float | None = None  # time.monotonic() by which the final checkpoint must persist
        self.served = threading.Event()  # a safe point took (or is taking) the final checkpoint
        self.frame_summary = ""
        # Set by the handler; the deadline thread (started at registration: starting a thread
        # takes locks the interrupted code may hold) waits for it.
        self.signalled = threading.Event()

    @property
    def pending(self) -> bool:
        return self.deadline is not None and not self.served.is_set()


_engines: weakref.WeakSet[SignalledEngine] = weakref.WeakSet()
_previous_handler: Any = None
_installed = False
_lock = threading.Lock()
_request = _StopRequest()
_explicit_safe_points = False
# No forward has run since the last optimizer step (or since the start): the next outermost
# forward pre-hook is a step boundary.
_step_boundary_open = True


def register(engine: SignalledEngine) -> None:
    """Covers ``engine`` by the SIGTERM handler and the exit hook."""
    global _installed, _previous_handler
    with _lock:
        _engines.add(engine)
        if _installed:
            return
        atexit.register(_at_exit)
        if threading.current_thread() is threading.main_thread():
            _previous_handler = signal.signal(signal.SIGTERM, _on_sigterm)
            threading.Thread(target=_exit_at_deadline, name="ckptlib-sigterm-deadline", daemon=True).start()
        _installed = True


def unregister(engine: SignalledEngine) -> None:
    with _lock:
        _engines.discard(engine)


def stop_deadline() -> float | None:
    """The monotonic time by which a requested final checkpoint must persist, or None."""
    return _request.deadline


def _on_sigterm(signum: int, frame: Any) -> None:
    # Signal context: record and return. No logging (the interrupted code may hold a logging
    # handler's lock), no engine call (it may hold the stager's lock), no state read.
    if _request.deadline is not None:
        return  # a second SIGTERM changes nothing: the first one's deadline stands
    engines = list(_engines)
    grace = max((engine.options.grace_period_s for engine in engines), default=30.0)
    _request.deadline = time.monotonic() + grace
    _request.frame_summary = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
    for engine in engines:
        engine.stop_requested.set()
    _request.signalled.set()


def safe_point() -> None:
    """Marks a point where the training state is whole (the end of a step).

    Call it where the state given by ``final_state`` matches the step it names (after
    ``optimizer.step()``, ``scheduler.step()`` and the step count's increment). If a SIGTERM is
    pending, the final checkpoint is taken here and the process exits (status 143). Once a script
    calls it, the forward and pre-step hooks are no longer safe points. Cheap when no signal is
    pending.
    """
    global _explicit_safe_points
    _explicit_safe_points = True
    if _request.pending:
        _serve(where="ckptlib.safe_point()")


def at_hook_point(*, kind: str) -> None:
    """Called by the staging hooks: a safe point when the script marks none of its own.

    Args:
        kind: ``"forward"`` (a module's forward pre-hook) or ``"pre-step"`` (a watched
            optimizer's pre-step hook: it only opens the next step boundary).
    """
    global _step_boundary_open
    if kind == "pre-step":
        _step_boundary_open = True
        return
    if not _step_boundary_open:
        return
    # The first forward pre-hook after a step is the outermost call's; it closes the boundary.
    _step_boundary_open = False
    if not _request.pending or _explicit_safe_points or _module_calls_on_stack() != 1:
        return
    _serve(where="the first forward after an optimizer step")


def _module_calls_on_stack() -> int:
    """Module calls (``torch.nn.Module._call_impl``) on the main thread's stack; walked only when
    a request is pending, so the hooks cost nothing otherwise."""
    calls = 0
    frame: FrameType | None = sys._getframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_call_impl" and code.co_filename.endswith(os.path.join("nn", "modules", "module.py")):
            calls += 1
        frame = frame.f_back
    return calls


def _serve(*, where: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        return  # exiting and the user's step boundary both belong to the main thread
    engines = [engine for engine in list(_engines) if not engine.defer_final_checkpoint]
    if not engines:
        return  # the integration (Trainer) takes it at its own step boundary
    _request.served.set()
    logger.warning(
        "[Concurrent Checkpoint] SIGTERM received (at %s): taking the final checkpoint at %s",
        _request.frame_summary,
        where,
    )
    for engine in engines:
        engine.final_checkpoint(deadline=_request.deadline)
    previous = _previous_handler
    if callable(previous) and previous not in (signal.SIG_DFL, signal.SIG_IGN):
        previous(signal.SIGTERM, sys._getframe())
    sys.exit(SIGTERM_EXIT_STATUS)


def mark_served() -> None:
    """An integration (the Trainer's step-end callback) is taking the final checkpoint itself."""
    _request.served.set()


def _exit_at_deadline() -> None:
    """Training reached no safe point within the grace period: persist nothing new, exit."""
    _request.signalled.wait()
    deadline = _request.deadline
    assert deadline is not None
    while time.monotonic() < deadline and not _request.served.is_set():
        _request.served.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
    if _request.served.is_set():
        # The safe point bounds its own waits by the same deadline; this only catches a final
        # checkpoint stuck past it (a wait that cannot be bounded, such as a full cache).
        time.sleep(max(0.0, deadline - time.monotonic()) + _STUCK_MARGIN_S)
        logger.error("[Concurrent Checkpoint] SIGTERM: the final checkpoint outlived the grace period; exiting")
        logging.shutdown()
        os._exit(SIGTERM_EXIT_STATUS)
    logger.error("[Concurrent Checkpoint] SIGTERM: training reached no safe point within the grace period; no final checkpoint (the last committed one stands)")
    logging.shutdown()
    os._exit(SIGTERM_EXIT_STATUS)


def _exited_through_exception() -> bool:
    return getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None


def _at_exit() -> None:
    # A pending SIGTERM or an unhandled exception: the state may be mid-step, so save nothing new.
    only_wait = _request.pending or _exited_through_exception()
    for engine in list(_engines):
        try:
            if not only_wait:
                engine.final_checkpoint(deadline=_request.deadline)
            engine.shutdown(timeout=_remaining(engine.options.grace_period_s))
        except Exception:  # exiting anyway
            logger.exception("[Concurrent Checkpoint] final checkpoint at exit failed")


def _remaining(default: float) -> float:
    if _request.deadline is None:
        return default
    return max(0.0, _request.deadline - time.monotonic())
