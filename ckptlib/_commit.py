"""The multi-rank commit: a checkpoint becomes selectable only once every rank's files are durable.

Order of calls, once a rank's last file of a checkpoint is closed (``MultiRankCommit.settle``):

1. every rank fsyncs its files in ``checkpoint-<step>.tmp/`` and, in a group of more than one,
   writes ``.rank-<r>.done`` durably;
2. rank 0 waits for every other rank's marker (``.rank-<r>.failed``, or no marker within
   ``CKPT_COMMIT_TIMEOUT_S``, fails the checkpoint), writes the manifest, removes the markers and
   commits (``ckptlib._format.commit``: rename into place, then ``latest``), one commit at a time;
3. the other ranks wait for the committed manifest (or until the engine shuts down).

A rank that fails writes ``.rank-<r>.failed`` with the reason; rank 0 removes the temporary
directory. A file written for a caller that commits it itself (``save_file``) only has its
directory fsynced (``settle_file``). Neither ends the job: the engine then completes it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

import ckptlib._format as _format
import ckptlib._layout as _layout
from ckptlib._dist import ProcessPlace
from ckptlib._inflight import InFlightCheckpoint
from ckptlib._types import CheckpointError

_COMMIT_TIMEOUT_S = float(os.environ.get("CKPT_COMMIT_TIMEOUT_S", "600"))
_POLL_S = 0.01


def _failed_marker(directory: Path, rank: int) -> Path:
    return directory / f".rank-{rank}.failed"


class MultiRankCommit:
    """Commits the checkpoints of one engine's ranks (see the module's order of calls).

    Args:
        root: The engine's ``concurrent_checkpoint`` directory.
        place: This process's rank and world size.
        closed: Set when the engine shuts down; a rank waiting for rank 0's commit then stops.
    """

    def __init__(self, *, root: Path, place: ProcessPlace, closed: threading.Event) -> None:
        self._root = root
        self._place = place
        self._closed = closed
        # Rank 0 commits one checkpoint at a time: each commit moves ``latest``.
        self._lock = threading.Lock()

    def settle(self, job: InFlightCheckpoint) -> None:
        """Commits ``job`` (rank 0) or waits for its commit (other ranks); on failure sets
        ``job.error`` and marks this rank failed."""
        try:
            if job.error is None:
                self._mark_rank_done(job)
                if self._place.rank == 0:
                    self._commit(job)
                else:
                    self._await_commit(job)
        except Exception as error:
            job.error = job.error or f"commit failed: {error}"
        if job.error is not None:
            self._mark_rank_failed(job)
            if self._place.rank == 0:
                _format.remove_tree(job.directory)

    def settle_file(self, job: InFlightCheckpoint) -> None:
        """Makes a ``save_file`` file's directory entry durable; on failure sets ``job.error``."""
        try:
            if job.error is None:
                _format.fsync_path(job.directory)
        except OSError as error:
            job.error = f"commit failed: {error}"

    def _mark_rank_done(self, job: InFlightCheckpoint) -> None:
        # The state's files were fsynced as they were closed; the small files written beside
        # them (the Trainer's) are fsynced here.
        closed = {plan.name for plan in job.plan.files}
        for path in job.directory.iterdir():
            if path.is_file() and not path.name.startswith(".") and path.name not in closed:
                _format.fsync_path(path)
        if self._place.world_size > 1:  # alone, rank 0 commits at once: no one reads a marker
            _format.write_bytes_durably(_format.rank_marker(job.directory, self._place.rank), b"ok\n")

    def _mark_rank_failed(self, job: InFlightCheckpoint) -> None:
        with contextlib.suppress(OSError):
            _failed_marker(job.directory, self._place.rank).write_text(job.error or "failed")

    def _commit(self, job: InFlightCheckpoint) -> None:
        deadline = time.monotonic() + _COMMIT_TIMEOUT_S
        for rank in range(1, self._place.world_size):
            while not _format.rank_marker(job.directory, rank).exists():
                failed = _failed_marker(job.directory, rank)
                if failed.exists():
                    raise CheckpointError(f"rank {rank} failed: {failed.read_text()}")
                if time.monotonic() > deadline:
                    raise CheckpointError(f"rank {rank} did not finish within {_COMMIT_TIMEOUT_S:.0f}s")
                time.sleep(_POLL_S)
        files = {path.name: path.stat().st_size for path in sorted(job.directory.iterdir()) if path.is_file() and not path.name.startswith(".")}
        checksums = {}
        for name, size in files.items():
            fd = os.open(job.directory / name, os.O_RDONLY)
            try:
                checksums[name] = _layout.sampled_crc32(fd, size)
            finally:
                os.close(fd)
        manifest = {
            "format": _format.FORMAT_VERSION,
            "step": job.step,
            "world_size": self._place.world_size,
            "keys": job.plan.keys,
            "files": files,
            "checksum": _layout.CHECKSUM_NAME,
            "checksums": checksums,
            "bytes": sum(files.values()),
            "committed_at": time.time(),
        }
        _format.write_manifest(job.directory, manifest)
        for marker in job.directory.glob(".rank-*"):
            marker.unlink(missing_ok=True)
        with self._lock:
            _format.commit(self._root, job.step)

    def _await_commit(self, job: InFlightCheckpoint) -> None:
        deadline = time.monotonic() + _COMMIT_TIMEOUT_S
        while not (job.target / _format.MANIFEST_NAME).exists():
            if time.monotonic() > deadline:
                raise CheckpointError(f"rank 0 did not commit step {job.step} within {_COMMIT_TIMEOUT_S:.0f}s")
            if self._closed.is_set():
                return
            time.sleep(_POLL_S)
