"""SIGTERM (Spot reclaim, stop) and interpreter exit: one final checkpoint, persisted in the grace period.

The SIGTERM handler never copies state itself when an integration owns a step boundary (the
Trainer): it only raises ``stop_requested``, and the integration saves at the end of the step, where
parameters are consistent. Without one, it waits for the checkpoints in flight, takes the final
checkpoint from ``final_state`` and exits with status 143.
"""

from __future__ import annotations

import atexit
import logging
import signal
import sys
import threading
import weakref
from typing import Any, Protocol

from ckptlib._config import RuntimeConfig

logger = logging.getLogger(__name__)


class SignalledEngine(Protocol):
    """What the handlers need of ``ckptlib.CheckpointEngine`` (named here, not imported: the
    engine imports this module)."""

    options: RuntimeConfig
    stop_requested: threading.Event
    defer_final_checkpoint: bool

    def final_checkpoint(self) -> None: ...

    def shutdown(self, *, timeout: float | None = None) -> None: ...


_engines: weakref.WeakSet[SignalledEngine] = weakref.WeakSet()
_previous_handler: Any = None
_installed = False
_lock = threading.Lock()


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
        _installed = True


def unregister(engine: SignalledEngine) -> None:
    with _lock:
        _engines.discard(engine)


def _on_sigterm(signum: int, frame: Any) -> None:
    logger.warning("[Concurrent Checkpoint] SIGTERM received: taking a final checkpoint")
    engines = list(_engines)
    deferred = [engine for engine in engines if engine.defer_final_checkpoint]
    for engine in engines:
        engine.stop_requested.set()
    if deferred and len(deferred) == len(engines):
        return
    for engine in engines:
        if not engine.defer_final_checkpoint:
            engine.final_checkpoint()
    if callable(_previous_handler) and _previous_handler not in (signal.SIG_DFL, signal.SIG_IGN):
        _previous_handler(signum, frame)
    sys.exit(128 + signum)


def _at_exit() -> None:
    for engine in list(_engines):
        try:
            engine.final_checkpoint()
            engine.shutdown(timeout=engine.options.grace_period_s)
        except Exception:  # noqa: BLE001 - exiting anyway
            logger.exception("[Concurrent Checkpoint] final checkpoint at exit failed")
