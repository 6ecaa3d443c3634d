"""In-memory per-step snapshots, and resuming from their replicas (checkpointless failover).

The platform mounts a memory-backed directory into the run and names it in ``CKPT_SNAPSHOT_DIR``
(``CKPT_SNAPSHOT_EVERY``: only steps divisible by it are snapshotted, default 1). Order of calls:

1. ``CheckpointEngine.snapshot(state, step=…)`` (training thread) → ``Snapshots.take``: unless the
   step is skipped (not a multiple of ``every``, a SIGTERM is pending, or the previous snapshot is
   still in flight: never queued behind it), the state goes to a second engine of this rank's own,
   opened on first use by the callable the checkpoint engine hands in: a group of one (it commits
   alone, no cross-rank markers), no signal handler, no final checkpoint, no commit line (a
   snapshot is not a checkpoint: the console counts commit lines as checkpoints). It stages and
   writes as ``save`` does, into ``$CKPT_SNAPSHOT_DIR/rank-<global rank>/concurrent_checkpoint/``
   in ckptlib's committed format (``ckptlib._format``), so that ``read_latest`` reads it.
2. After each commit the snapshot engine keeps the newest ``KEEP`` committed snapshots.
3. The node agent copies each rank's newest committed snapshot to another node's memory. A
   failover attempt gets ``CKPT_LAST_STEP=S`` and ``CKPT_RESUME_ROOT`` (read-only, the replicas):
   when step S is not committed on disk, ``resume_replica`` checks
   ``$CKPT_RESUME_ROOT/rank-<rank>/concurrent_checkpoint/checkpoint-S`` (no link followed, sizes
   and sampled checksums as ``read_latest`` checks them) and either returns it, logging
   ``[Concurrent Checkpoint] resuming from the in-memory replica step=S``, or logs why not and
   returns None: the caller resumes as it would without replicas.
4. ``close`` (the checkpoint engine's ``shutdown``) waits for the snapshot in flight and stops it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import ckptlib._format as _format
from ckptlib._events import LOG_PREFIX
from ckptlib._layout import CHECKPOINT_SUBDIR, COMMITTED_RE, checkpoint_problem, open_dir
from ckptlib._types import CheckpointResult

logger = logging.getLogger(__name__)

SNAPSHOT_DIR_ENV = "CKPT_SNAPSHOT_DIR"
SNAPSHOT_EVERY_ENV = "CKPT_SNAPSHOT_EVERY"
RESUME_ROOT_ENV = "CKPT_RESUME_ROOT"
# Committed snapshots kept per rank: the newest, and the one the agent may still be copying.
KEEP = 2


class SnapshotEngine(Protocol):
    """What snapshots need of the engine that writes them (a ``CheckpointEngine`` of one rank)."""

    on_commit: list[Callable[[CheckpointResult], None]]

    def save(
        self,
        state: Mapping[str, Any],
        *,
        step: int,
        capture_rng: bool = ...,
        write_extra_files: Callable[[Path], None] | None = ...,
        write_files_later: Callable[[Path], None] | None = ...,
    ) -> bool: ...

    def in_flight(self) -> int: ...

    def shutdown(self, *, timeout: float | None = None) -> None: ...


@dataclass(frozen=True)
class SnapshotSettings:
    """Where this rank's snapshots go and how often.

    Attributes:
        root: ``<snapshot dir>/rank-<rank>/concurrent_checkpoint``.
        every: Only steps divisible by it are snapshotted.
    """

    root: Path
    every: int


def rank_root(base: str | os.PathLike[str], rank: int) -> Path:
    """``<base>/rank-<rank>/concurrent_checkpoint``: one rank's snapshots, or their replicas."""
    return Path(base) / f"rank-{rank}" / CHECKPOINT_SUBDIR


def snapshot_settings(*, rank: int, directory: str | os.PathLike[str] | None = None, every: int | None = None) -> SnapshotSettings | None:
    """The snapshot settings of a rank, or None when snapshots are off.

    Args:
        rank: The global rank.
        directory: The snapshot directory; default ``CKPT_SNAPSHOT_DIR`` (unset or empty: off).
        every: Default ``CKPT_SNAPSHOT_EVERY``, else 1; a value that is not an integer ≥ 1 is
            logged and taken as 1.
    """
    if directory is None:
        directory = os.environ.get(SNAPSHOT_DIR_ENV, "")
    if not os.fspath(directory):
        return None
    if every is None:
        raw = os.environ.get(SNAPSHOT_EVERY_ENV, "").strip() or "1"
        try:
            every = int(raw)
        except ValueError:
            every = 0
        if every < 1:
            logger.warning("%s %s=%r is not an integer >= 1; snapshotting every step", LOG_PREFIX, SNAPSHOT_EVERY_ENV, raw)
            every = 1
    return SnapshotSettings(root=rank_root(Path(directory).absolute(), rank), every=max(1, every))


class Snapshots:
    """One rank's snapshots (see the module's order of calls).

    Args:
        settings: Where and how often.
        open_engine: Opens the engine that writes them, given its output directory (the parent
            of ``settings.root``); called on the first snapshot taken.
    """

    def __init__(self, settings: SnapshotSettings, *, open_engine: Callable[[Path], SnapshotEngine]) -> None:
        self.settings = settings
        self._open_engine = open_engine
        self._engine: SnapshotEngine | None = None
        self._lock = threading.Lock()
        self._closed = False

    def take(
        self,
        state: Mapping[str, Any],
        *,
        step: int,
        capture_rng: bool = True,
        write_extra_files: Callable[[Path], None] | None = None,
        write_files_later: Callable[[Path], None] | None = None,
    ) -> bool:
        """Starts a snapshot of ``state`` at ``step`` unless it is skipped.

        Returns:
            True if a snapshot was started; False if skipped (not a multiple of ``every``, the
            previous one still in flight, the step already snapshotted, or it could not start).
        """
        if step % self.settings.every:
            return False
        with self._lock:
            if self._closed:
                return False
            engine = self._engine
            if engine is None:
                engine = self._engine = self._open_engine(self.settings.root.parent)
                engine.on_commit.append(self._rotate)
        if engine.in_flight():
            logger.debug("%s snapshot of step %s skipped: the previous one is still in flight", LOG_PREFIX, step)
            return False
        return engine.save(
            state,
            step=step,
            capture_rng=capture_rng,
            write_extra_files=write_extra_files,
            write_files_later=write_files_later,
        )

    def close(self, *, timeout: float | None = None) -> None:
        """Waits (up to ``timeout``) for the snapshot in flight, then stops its threads."""
        with self._lock:
            self._closed = True
            engine, self._engine = self._engine, None
        if engine is not None:
            engine.shutdown(timeout=timeout)

    def _rotate(self, result: CheckpointResult) -> None:
        """Keeps the newest ``KEEP`` committed snapshots (on the writer thread, after a commit).

        Unlike ``_format.rotate`` it does not verify the checkpoints it lists: that reads back
        every sampled block of each, at every step. Only this rank writes here, one at a time.
        """
        logger.debug("%s snapshot committed step=%s path=%s", LOG_PREFIX, result.step, result.path)
        if _format.superseded_message("rotates nothing out"):
            return
        root = self.settings.root
        steps = sorted(int(entry.name.removeprefix(_format.CHECKPOINT_PREFIX)) for entry in os.scandir(root) if COMMITTED_RE.match(entry.name))
        for step in steps[: max(0, len(steps) - KEEP)]:
            doomed = root / f".deleting-{step}"
            # Renamed first: a reader (the node agent's copy) never sees a half-deleted snapshot.
            os.replace(_format.committed_dir(root, step), doomed)
            _format.remove_tree(doomed)


def resume_directory(root: Path, step: int, *, rank: int) -> Path:
    """The checkpoint ``CheckpointEngine.load(step)`` reads: ``checkpoint-<step>`` under ``root``;
    on a failover attempt (``CKPT_RESUME_ROOT`` set) where that is not committed, this rank's
    replica of it when whole (``resume_replica``), else the latest committed under ``root``, if any."""
    directory = _format.committed_dir(root, step)
    if not os.environ.get(RESUME_ROOT_ENV) or step in _format.committed_steps(root):
        return directory
    replica = resume_replica(step, rank=rank)
    if replica is not None:
        return replica
    latest = _format.read_latest(root)
    return directory if latest is None else _format.committed_dir(root, latest)


def resume_replica(step: int, *, rank: int) -> Path | None:
    """This rank's replica of ``step`` under ``CKPT_RESUME_ROOT`` if it is whole, else None.

    Logs ``resuming from the in-memory replica step=<step>`` when it returns one; when
    ``CKPT_RESUME_ROOT`` is set but the replica is missing or damaged, logs why (the caller goes
    on as without replicas). Nothing below ``CKPT_RESUME_ROOT`` is followed if it is a link.
    """
    base = os.environ.get(RESUME_ROOT_ENV, "")
    if not base or step < 0:
        return None
    problem = replica_problem(Path(base), rank=rank, step=step)
    if problem is not None:
        logger.warning("%s not resuming from the in-memory replica step=%s: %s", LOG_PREFIX, step, problem)
        return None
    logger.info("%s resuming from the in-memory replica step=%s", LOG_PREFIX, step)
    return _format.committed_dir(rank_root(base, rank), step)


def replica_problem(base: Path, *, rank: int, step: int) -> str | None:
    """Why ``<base>/rank-<rank>/concurrent_checkpoint/checkpoint-<step>`` must not be resumed
    (naming the file), or None: it is committed and its files have the sizes and sampled
    checksums its manifest records. Each component below ``base`` is opened without following."""
    descriptors: list[int] = []
    where = base
    try:
        try:
            descriptors.append(open_dir(base))
            for part in (f"rank-{rank}", CHECKPOINT_SUBDIR):
                where = where / part
                descriptors.append(open_dir(part, dir_fd=descriptors[-1]))
        except OSError as error:
            return f"{where}: {error.strerror or error}"
        name = f"{_format.CHECKPOINT_PREFIX}{step}"
        problem = checkpoint_problem(descriptors[-1], name)
        return None if problem is None else f"{where}/{problem}"
    finally:
        for fd in descriptors:
            os.close(fd)
