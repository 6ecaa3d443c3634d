"""The checkpoints in flight (``InFlightCheckpoint``) and how each one ends: committed or failed, reported once.

A job enters ``InFlightBook.add`` from ``save``; it leaves through ``InFlightBook.complete`` (after the
commit, see ``ckptlib._commit``) or ``InFlightBook.fail`` (it could not start). Completing records the
result, logs the commit line (rank 0) or the error, runs the after-commit callbacks, queues the
result for the next ``wait(persist=True)``, removes the job from the list and then sets its
``done`` event, so a waiter that wakes sees the list without it.

Locks: ``InFlightBook``'s lock guards the list and the unreported results; ``InFlightCheckpoint.lock`` guards one checkpoint's
byte count, files left and first error, which writer threads and the stager update concurrently.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ckptlib._format as _format
from ckptlib._cache import PAGE
from ckptlib._events import LOG_PREFIX
from ckptlib._guard import VersionGuard
from ckptlib._plan import StatePlan
from ckptlib._types import CheckpointResult

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class InFlightCheckpoint:
    """One checkpoint (or, ``external``, one file) of this rank, from ``save`` until it ends."""

    step: int
    directory: Path
    target: Path
    plan: StatePlan
    started: float
    blocking_s: float = 0.0
    bytes: int = 0
    error: str | None = None
    # A file at a path the caller lays out and commits itself (``save_file``).
    external: bool = False
    files_left: int = 0
    staged: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    result: CheckpointResult | None = None
    # Run on the writer thread that finishes the job, before the commit (``save``'s option).
    write_files_later: Callable[[Path], None] | None = None
    # The direct-I/O memory alignment where its files go (``ckptlib._writer.memory_alignment``).
    mem_align: int = PAGE
    # The versions of the tensors it copies lazily (``ckptlib._guard``); None: copied in ``save``.
    guard: VersionGuard | None = None
    # ``save_file``: the save's number (the newest save of a path wins).
    seq: int = -1

    def fail_in_flight(self, message: str) -> None:
        """Records why the job fails, while other threads still work on it (the first reason wins)."""
        with self.lock:
            if self.error is None:
                self.error = message


class InFlightBook:
    """The jobs in flight of one engine, and the results of those that ended.

    Args:
        rank: This process's global rank (rank 0 logs the commit line and removes failed
            temporary directories).
        on_commit: Called with the result of each committed checkpoint (the engine's list:
            callers append to it).
        announce: Log the commit line (a snapshot's engine does not: the console counts each
            commit line as a checkpoint).
    """

    def __init__(self, *, rank: int, on_commit: list[Callable[[CheckpointResult], None]], announce: bool = True) -> None:
        self._rank = rank
        self._announce = announce
        self._on_commit = on_commit
        self._jobs: list[InFlightCheckpoint] = []
        self._lock = threading.Lock()
        self.results: list[CheckpointResult] = []
        self._unreported: list[CheckpointResult] = []

    def add(self, job: InFlightCheckpoint) -> None:
        with self._lock:
            self._jobs.append(job)

    def in_flight(self) -> list[InFlightCheckpoint]:
        """The jobs not yet ended, oldest first (a copy)."""
        with self._lock:
            return list(self._jobs)

    def unstaged(self) -> list[InFlightCheckpoint]:
        """The jobs whose state is not yet all staged, oldest first."""
        with self._lock:
            return [job for job in self._jobs if not job.staged.is_set()]

    def has_step(self, step: int) -> bool:
        with self._lock:
            return any(job.step == step for job in self._jobs)

    def empty(self) -> bool:
        with self._lock:
            return not self._jobs

    def take_unreported(self) -> list[CheckpointResult]:
        """The results of the jobs ended since the previous call, oldest first."""
        with self._lock:
            reported, self._unreported = self._unreported, []
        return reported

    def fail(self, job: InFlightCheckpoint, message: str) -> None:
        """Ends a job that could not start."""
        job.error = message
        job.staged.set()
        if self._rank == 0:
            _format.remove_tree(job.directory)
        self.complete(job)

    def complete(self, job: InFlightCheckpoint) -> None:
        """Ends a job: committed when it has no error, else failed."""
        result = CheckpointResult(
            step=job.step,
            path=str(job.target),
            bytes=job.bytes,
            blocking_s=job.blocking_s,
            persist_s=time.perf_counter() - job.started,
            committed=job.error is None,
            error=job.error,
        )
        job.result = result
        self.results.append(result)
        if job.external:
            if not result.committed:
                logger.error("%s writing %s failed: %s", LOG_PREFIX, job.target, job.error)
        elif result.committed:
            if self._rank == 0 and self._announce:
                logger.info(result.log_line())
            for callback in self._on_commit:
                try:
                    callback(result)
                except Exception:  # rotation must not break training
                    logger.exception("%s after-commit callback failed", LOG_PREFIX)
        else:
            logger.error("%s checkpoint step=%s failed: %s", LOG_PREFIX, job.step, job.error)
        with self._lock:
            self._unreported.append(result)
            if job in self._jobs:
                self._jobs.remove(job)
        job.done.set()
