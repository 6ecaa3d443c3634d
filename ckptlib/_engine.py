"""The asynchronous checkpoint engine: stage → persist → commit.

Order of calls for one checkpoint:

1. ``save(state, step=…)`` (training thread): plans each file as its bytes in order (see
   ``ckptlib._plan``), clones or serializes what forward or user code may change (buffers,
   scheduler, RNG, plain values), queues the checkpoint for staging, stages a first part and
   returns.
2. Staging (``ckptlib._stage``), on the training thread at hook points (``ckptlib._hooks``: module
   forward pre-hooks, parameters' post-accumulate-grad hooks, the optimizer's pre-step hook): page-
   aligned CPU tensor ranges go to the writers as they are (no copy); everything else is copied
   into host-cache chunks, a few chunks ahead of the writers. The next ``optimizer.step()``
   waits until nothing of the checkpoint still needs the live tensors: it is the only thing that
   changes them.
3. ``parser_threads`` writer threads (``ckptlib._background``): write each item into
   ``checkpoint-<step>.tmp/`` with direct I/O (``ckptlib._writer``), give chunks back, fsync each
   finished file; the last one marks this rank done. When training reaches no hook point for a
   while, they stage in its place.
4. Rank 0 commits once every rank is done (``ckptlib._commit``, on-disk steps in
   ``ckptlib._format``); the job ends committed or failed and rank 0 logs one line
   (``ckptlib._inflight``).
5. ``wait(persist=True)`` / ``shutdown()`` block until the checkpoints in flight are committed.

This module holds the public API and wires the steps together; each step has its own module.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

import ckptlib._format as _format
import ckptlib._signals as _signals
from ckptlib._background import BackgroundWriters
from ckptlib._cache import PAGE, HostCache
from ckptlib._commit import MultiRankCommit
from ckptlib._config import RuntimeConfig, check_copy_mode
from ckptlib._dist import ProcessPlace, current_place
from ckptlib._events import LOG_PREFIX, install_console_handler
from ckptlib._guard import VersionGuard, guard_object
from ckptlib._hooks import StagingPoints
from ckptlib._inflight import InFlightBook, InFlightCheckpoint
from ckptlib._plan import StatePlan, plan_object, plan_state, protected_storages, restore_rng_state
from ckptlib._reader import check_fits, read_checkpoint
from ckptlib._snapshot import Snapshots, resume_directory, snapshot_settings
from ckptlib._stage import Stager
from ckptlib._types import CheckpointError, CheckpointResult, LoadedCheckpoint
from ckptlib._writer import WriteItem, memory_alignment

logger = logging.getLogger(__name__)

# ``save_file`` writes ``<name><FILE_TMP_SUFFIX>-<pid>-<n>`` and renames it onto its path once durable.
FILE_TMP_SUFFIX = ".ckptlib-tmp"

# How long shutdown waits for each writer thread to return once everything in flight is done.
_JOIN_TIMEOUT_S = 5.0


class CheckpointEngine:
    """Saves training state without stopping training, and reads it back.

    Args:
        output_dir: Checkpoints go to ``<output_dir>/concurrent_checkpoint/``. Default: the
            ``CKPT_OUTPUT_DIR`` environment variable, else the working directory.
        host_cache_size: Bound of the host staging cache in GB.
        parser_threads: Writer threads.
        pin_host_cache: Pin the cache when CUDA is present.
        rank: The launcher's local rank (informational); the global rank comes from ``RANK``.
        grace_period_s: Time a final checkpoint (SIGTERM, exit) may take to persist.
        final_state: Returns ``(state, step)`` for the final checkpoint on SIGTERM and at exit;
            without it, those only wait for the checkpoints in flight.
        handle_signals: Install the SIGTERM handler and the exit hook.
        copy_mode: ``"checked"`` (default): parameters and optimizer state are copied lazily,
            and a checkpoint in which one of them changed before its copy was taken is not
            committed (a warning names it; later saves copy before returning); ``"eager"``:
            everything is copied before ``save`` returns; ``"lazy"``: upstream DataStates'
            unchecked lazy copy (``ckptlib._guard``).
        snapshot_dir: In-memory snapshots (``snapshot``) go to
            ``<snapshot_dir>/rank-<rank>/concurrent_checkpoint/``; default: ``CKPT_SNAPSHOT_DIR``
            (unset or ``""``: ``snapshot`` does nothing). ``snapshot_every``: default
            ``CKPT_SNAPSHOT_EVERY``, else 1 (``ckptlib._snapshot``).
        place: The rank and world size its commits see; default: the launcher's (a snapshot
            engine is a group of one).
        announce_commits: Log the commit line (a snapshot engine does not).
    """

    def __init__(
        self,
        *,
        output_dir: str | os.PathLike[str] | None = None,
        host_cache_size: float = 50.0,
        parser_threads: int = 1,
        pin_host_cache: bool = True,
        rank: int | None = None,
        grace_period_s: float = 30.0,
        final_state: Callable[[], tuple[Mapping[str, Any], int]] | None = None,
        handle_signals: bool = True,
        copy_mode: str = "checked",
        snapshot_dir: str | os.PathLike[str] | None = None,
        snapshot_every: int | None = None,
        place: ProcessPlace | None = None,
        announce_commits: bool = True,
    ) -> None:
        install_console_handler()
        self.copy_mode = check_copy_mode(copy_mode)
        # Set once a lazily copied tensor changed before its copy: every later save copies first.
        self._copy_now = copy_mode == "eager"
        self.options = RuntimeConfig(
            host_cache_size=host_cache_size,
            parser_threads=parser_threads,
            pin_host_cache=pin_host_cache,
            grace_period_s=grace_period_s,
        )
        if output_dir is None:
            output_dir = os.environ.get("CKPT_OUTPUT_DIR") or os.getcwd()
        self.output_dir = Path(output_dir).absolute()
        self.root = _format.checkpoint_root(self.output_dir)
        self.place: ProcessPlace = place or current_place(local_rank=rank)
        self.cache = HostCache(limit_bytes=self.options.host_cache_bytes, pin=pin_host_cache)
        self.final_state = final_state
        # Set by an integration that takes the final checkpoint at a step boundary itself.
        self._defer_final_checkpoint = False
        # Set by an integration whose final checkpoint is more than a state (Trainer's extra files).
        self.final_save: Callable[[], None] | None = None
        self.stop_requested = threading.Event()
        self.on_commit: list[Callable[[CheckpointResult], None]] = []
        self._stepped_modules: list[weakref.ref[torch.nn.Module]] = []
        self._mem_align: int | None = None
        # save_file: each save's own temporary name; the newest save of a path installed wins.
        self._file_seq = itertools.count()
        self._file_lock = threading.Lock()
        self._installed: dict[Path, int] = {}

        self._jobs = InFlightBook(rank=self.place.rank, on_commit=self.on_commit, announce=announce_commits)
        settings = snapshot_settings(rank=self.place.rank, directory=snapshot_dir, every=snapshot_every)
        self._snapshots = None if settings is None else Snapshots(settings, open_engine=self._open_snapshot_engine)
        # One job's commit and its after-commit callbacks (the Trainer's rotation) before the next
        # job commits: with save_total_limit=N a kill leaves at most N + 1 committed checkpoints.
        self._finish_lock = threading.Lock()
        self._closed = threading.Event()
        self._committer = MultiRankCommit(root=self.root, place=self.place, closed=self._closed)
        write_queue: queue.Queue[WriteItem | None] = queue.Queue()
        # Chunks kept ahead of the writers at ordinary staging points.
        window_bytes = min(self.cache.limit_bytes, max(4, 2 * parser_threads) * self.cache.chunk_bytes)
        self._stager = Stager(self.cache, window_bytes=window_bytes, hand_over=write_queue.put)
        self._handle_signals = handle_signals
        self._points = StagingPoints(self._stager, self._jobs, keep_forward=self._signals_need_forward, after_stage=self._seal_at_hook)
        self._writers = BackgroundWriters(
            write_queue,
            count=parser_threads,
            stager=self._stager,
            cache=self.cache,
            # Chunks kept for reuse (a fresh chunk costs page faults): the window, and room for
            # what the pre-step hook copies of live ranges the disk has not reached (0.12–0.2 s at
            # that hook with 2 windows kept, 0.09 s with 4, for a 2 GB state on the development VM).
            keep_bytes=4 * window_bytes,
            finished=self._finish,
        )

        if self.place.rank == 0:
            _format.remove_stale_tmp_dirs(self.root)
        self._writers.start()
        if handle_signals:
            _signals.register(self)
            # A SIGTERM before the first save still needs a safe point to be served at.
            self._points.hook_forward_passes()

    @property
    def defer_final_checkpoint(self) -> bool:
        """Set by an integration that takes the final checkpoint at a step boundary itself (the
        Trainer's callback): module forward passes are then no safe point for signals."""
        return self._defer_final_checkpoint

    @defer_final_checkpoint.setter
    def defer_final_checkpoint(self, value: bool) -> None:
        self._defer_final_checkpoint = value
        self._points.follow_staging()

    def _signals_need_forward(self) -> bool:
        return self._handle_signals and not self._defer_final_checkpoint

    # ---- public API -------------------------------------------------------------------------

    def save(
        self,
        state: Mapping[str, Any],
        *,
        step: int,
        sharded: bool = False,
        capture_rng: bool = True,
        write_extra_files: Callable[[Path], None] | None = None,
        write_files_later: Callable[[Path], None] | None = None,
    ) -> bool:
        """Starts a checkpoint of ``state`` at ``step`` and returns while it is staged and written.

        Args:
            state: Keys to live objects: modules (→ ``<key>.safetensors``), optimizers,
                schedulers, scalers, tensors or plain values (→ ``<key>.pt``). Module parameters
                and optimizer state are copied in the background until the optimizer's next
                ``step()``; everything else is copied before ``save`` returns.
            step: The training step; the directory is ``checkpoint-<step>``.
            sharded: Every rank holds different state (file names get ``_rank<r>``). By default
                the state is replicated (DDP): rank 0 writes it, every rank its RNG state.
            capture_rng: Also write the Trainer's ``rng_state*.pth``.
            write_extra_files: Called with the temporary directory to write small files
                (``trainer_state.json``, tokenizer, config) before ``save`` returns.
            write_files_later: Called with the temporary directory on a writer thread, after
                the state's files are written and before the commit (files that hold nothing
                training changes, or bytes captured before ``save`` was called). An exception
                fails the checkpoint.

        Returns:
            True if a checkpoint was started; False if ``step`` is already saved or could not
            be started (the error is logged and training goes on).
        """
        if self._closed.is_set():
            raise CheckpointError("the checkpoint engine is shut down")
        began = time.perf_counter()
        self._seal_jobs(all_read=False)
        if self._is_known_step(step):
            logger.debug("%s step %s is already saved or in flight; skipped", LOG_PREFIX, step)
            return False
        directory, target = _format.tmp_dir(self.root, step), _format.committed_dir(self.root, step)
        write_state = sharded or self.place.rank == 0
        mem_align = self._memory_alignment()
        guard = VersionGuard() if self.copy_mode == "checked" and not self._copy_now else None
        try:
            plan = plan_state(
                state,
                rank=self.place.rank,
                world_size=self.place.world_size,
                write_state=write_state,
                sharded=sharded,
                capture_rng=capture_rng,
                mem_align=mem_align,
                guard=guard,
            )
        except Exception as error:  # reported, training goes on
            job = InFlightCheckpoint(step=step, directory=directory, target=target, plan=StatePlan(), started=began)
            self._jobs.fail(job, f"cannot plan the checkpoint: {error}")
            return False
        job = InFlightCheckpoint(step=step, directory=directory, target=target, plan=plan, started=began, mem_align=mem_align)
        job.files_left = len(plan.files)
        job.write_files_later = write_files_later
        live = bool(plan.optimizers) and not self._copy_now
        job.guard = guard if live and guard else None
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if write_extra_files is not None:
                write_extra_files(directory)
        except Exception as error:  # reported, training goes on
            self._jobs.fail(job, f"cannot create {directory}: {error}")
            return False
        for optimizer in plan.optimizers:
            self.watch(optimizer)
        self._jobs.add(job)
        if not job.plan.files:
            # A rank with nothing to write still reports done, so rank 0 can commit.
            job.staged.set()
            threading.Thread(target=self._finish, args=(job,), name="ckptlib-commit", daemon=True).start()
        else:
            self._stager.add(job, live=live)
            # Without an optimizer nothing tells us when the tensors change: stage all now.
            self._stager.run(force=not live)
            self._points.follow_staging()
        job.blocking_s += time.perf_counter() - began
        return True

    def snapshot(self, state: Mapping[str, Any], *, step: int, **options: Any) -> bool:
        """Starts an in-memory snapshot of ``state`` at ``step`` (``ckptlib._snapshot``); a no-op
        without a snapshot directory. ``state`` and ``options`` (``capture_rng``,
        ``write_extra_files``, ``write_files_later``) are ``save``'s.

        Returns:
            True if a snapshot was started; False if snapshots are off, or this one is skipped:
            not a multiple of ``CKPT_SNAPSHOT_EVERY``, the previous one still in flight, a
            SIGTERM pending.
        """
        if self._snapshots is None or self.stop_requested.is_set() or self._closed.is_set():
            return False
        return self._snapshots.take(state, step=step, **options)

    def in_flight(self) -> int:
        """The checkpoints (and files) started and not yet ended."""
        return len(self._jobs.in_flight())

    def _open_snapshot_engine(self, output_dir: Path) -> CheckpointEngine:
        options = self.options
        return CheckpointEngine(
            output_dir=output_dir,
            host_cache_size=options.host_cache_size,
            parser_threads=options.parser_threads,
            pin_host_cache=options.pin_host_cache,
            handle_signals=False,
            copy_mode=self.copy_mode,
            snapshot_dir="",
            place=ProcessPlace(rank=0, world_size=1, local_rank=self.place.local_rank),
            announce_commits=False,
        )

    def save_file(self, obj: Any, path: str | os.PathLike[str]) -> InFlightCheckpoint:
        """Writes ``obj`` as a ``torch.save`` file at ``path``, in the background.

        For callers that lay out and commit their checkpoints themselves (DeepSpeed's
        checkpoint-engine interface, ``ckptlib.deepspeed``): no ``concurrent_checkpoint/``
        directory, no manifest, no ``latest``. Each call writes its own temporary file beside
        ``path`` (``<name>.ckptlib-tmp-<pid>-<n>``), renamed onto ``path`` once durable, so a
        reader never sees a half-written ``path``; when a path is saved again while an earlier
        save of it is in flight, the newest save's file stays (last writer wins), an older one
        that finishes later is dropped. The file is whole and durable (fsynced, and its
        directory too) once ``wait(persist=True)`` returns; a failure is reported there. Its
        tensors are staged before the next step of an optimizer given to ``watch``, or before
        this returns when none is watched.

        Returns:
            The file's job (internal): its ``done`` event is set once the file is durable or
            failed, with ``error`` set on failure.
        """
        if self._closed.is_set():
            raise CheckpointError("the checkpoint engine is shut down")
        began = time.perf_counter()
        target = Path(path)
        self._seal_jobs(all_read=False)
        watched = self._points.watches_an_optimizer() and not self._copy_now
        # Only what a watched optimizer's step alone changes stays live; buffers (BatchNorm
        # statistics) and anything else are copied now.
        protected = None
        if watched:
            modules = tuple(module for ref in self._stepped_modules if (module := ref()) is not None)
            protected = protected_storages(self._points.watched_optimizers(), modules)
        seq = next(self._file_seq)
        tmp_name = f"{target.name}{FILE_TMP_SUFFIX}-{os.getpid()}-{seq}"
        plan = StatePlan(files=[plan_object(tmp_name, obj, background=True, protected=protected)])
        guard = VersionGuard() if watched and self.copy_mode == "checked" else None
        if guard is not None:
            guard_object(guard, target.name, obj, protected)
        job = InFlightCheckpoint(
            step=-1,
            directory=target.parent,
            target=target,
            plan=plan,
            started=began,
            external=True,
            mem_align=memory_alignment(target.parent),
        )
        job.files_left = 1
        job.seq = seq
        job.guard = guard if guard else None
        self._jobs.add(job)
        self._stager.add(job, live=watched)
        self._stager.run(force=not watched)
        self._points.follow_staging()
        job.blocking_s += time.perf_counter() - began
        return job

    def wait(self, persist: bool = False, *, timeout: float | None = None) -> list[CheckpointResult]:
        """Blocks until the checkpoints in flight are staged, or also persisted.

        Args:
            persist: Also wait until they are committed (or failed).
            timeout: Give up after this many seconds.

        Returns:
            With ``persist``, the results of every checkpoint finished since the previous
            ``wait(persist=True)`` (committed or failed), oldest first; else [].
        """
        self._stager.run(force=True)
        self._points.follow_staging()
        self._seal_jobs(all_read=True)  # every copy is taken now
        jobs = self._jobs.in_flight()
        deadline = None if timeout is None else time.monotonic() + timeout
        for job in jobs:
            event = job.done if persist else job.staged
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            event.wait(remaining)
        if not persist:
            return []
        return self._jobs.take_unreported()

    def staging_stats(self) -> dict[str, int]:
        """Bytes this engine copied into the host cache, and bytes it wrote straight from live
        tensors (CPU tensors aligned for direct I/O where the file puts them: ``ckptlib._stage``),
        since it started."""
        return {"copied_bytes": self._stager.copied_bytes, "live_bytes": self._stager.live_bytes}

    def latest_step(self) -> int | None:
        """The newest committed step under this engine's output directory, or None."""
        return _format.read_latest(self.root)

    def committed_steps(self) -> list[int]:
        """All committed steps, ascending."""
        return _format.committed_steps(self.root)

    @property
    def results(self) -> tuple[CheckpointResult, ...]:
        """Every finished checkpoint of this engine, in finishing order."""
        return tuple(self._jobs.results)

    def load(
        self,
        step: int | None = None,
        *,
        into: Mapping[str, Any] | None = None,
        restore_rng: bool | None = None,
        map_location: str | torch.device = "cpu",
    ) -> LoadedCheckpoint:
        """Reads a committed checkpoint.

        A failover attempt (``CKPT_RESUME_ROOT`` set) asking for a ``step`` not committed here
        reads this rank's in-memory replica of it when that is whole; else (the reason is
        logged) the latest committed checkpoint here: the result's ``step`` says which.

        Args:
            step: The step; None or -1 for the latest committed one.
            into: Live objects to ``load_state_dict`` into, by key (as given to ``save``).
            restore_rng: Restore the RNG states; default: when ``into`` is given.
            map_location: Where tensors of ``.pt`` files go.

        Returns:
            The checkpoint.

        Raises:
            CheckpointError: No such committed checkpoint, a damaged one (the message names the
                file; the latest is chosen among undamaged ones only), or one that does not fit
                ``into`` (keys, shapes: checked before anything is loaded).
        """
        if step is None or step == -1:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f"no committed checkpoint under {self.root}")
        directory = resume_directory(self.root, step, rank=self.place.rank)
        loaded = read_checkpoint(directory, place=self.place, map_location=map_location)
        if into:
            check_fits(loaded.state, into, loaded.path)  # before anything changes
            for key, target in into.items():
                if key in loaded.state and hasattr(target, "load_state_dict"):
                    target.load_state_dict(loaded.state[key])
        if (into is not None if restore_rng is None else restore_rng) and "rng_state" in loaded.state:
            restore_rng_state(loaded.state["rng_state"])
        return loaded

    def shutdown(self, *, timeout: float | None = None) -> None:
        """Waits for the checkpoints in flight to persist, then stops the threads."""
        if self._closed.is_set():
            return
        self.wait(persist=True, timeout=timeout)
        if self._snapshots is not None:
            self._snapshots.close(timeout=timeout)
        self._closed.set()
        self._points.remove()
        # Joined, not left to die with the interpreter: a daemon thread still inside a torch call
        # that released the GIL when Python finalizes aborts the process ("terminate called
        # without an active exception", pytorch/pytorch#38228). Past the timeout (a grace period
        # ran out) they may still be writing: then don't wait.
        settled = self._jobs.empty()  # a job leaves the list when it completes
        self._writers.stop(join_timeout=_JOIN_TIMEOUT_S if settled else 0)
        self.cache.clear()
        _signals.unregister(self)

    def final_checkpoint(self, *, deadline: float | None = None) -> None:
        """Takes the final checkpoint (if ``final_state`` is set) and waits for it to persist.

        Call it only where the state is whole (``ckptlib._signals`` calls it at a safe point).

        Args:
            deadline: ``time.monotonic()`` by which to stop waiting (a SIGTERM's grace period);
                default: ``grace_period_s`` from now.
        """
        if self._closed.is_set():
            return
        if deadline is None:
            deadline = time.monotonic() + self.options.grace_period_s
        try:
            if self.final_save is not None:
                self.final_save()
            elif self.final_state is not None:
                state, step = self.final_state()
                if state:
                    self.save(state, step=step)
        except Exception:
            logger.exception("%s final checkpoint could not be started", LOG_PREFIX)
        self.wait(persist=True, timeout=max(0.0, deadline - time.monotonic()))

    # ---- stage ------------------------------------------------------------------------------

    def watch(self, optimizer: torch.optim.Optimizer, *, stepped_modules: tuple[torch.nn.Module, ...] = ()) -> None:
        """Stages at ``optimizer``'s steps and its parameters' gradient accumulation.

        Before each step, everything still unstaged is staged (the step waits): the step is the
        only thing that changes parameters and optimizer state. ``save`` calls this for the
        optimizers in its state.

        Args:
            optimizer: The optimizer.
            stepped_modules: Modules whose parameters only this optimizer's step changes though
                they are not its parameters (DeepSpeed copies them from its flat partitions);
                ``save_file`` then leaves them live too, instead of copying them.
        """
        self._points.watch(optimizer)
        for module in stepped_modules:
            self._stepped_modules.append(weakref.ref(module))

    def _stage_at_hook(self, *, force: bool) -> None:
        self._points.stage(force=force)

    def _finish(self, job: InFlightCheckpoint) -> None:
        """A job's last file is closed (on a writer thread): commit it, then end it."""
        self._seal(job)  # unless the training thread did already
        if job.external:
            self._install_file(job)
            self._committer.settle_file(job)
            self._jobs.complete(job)
            return
        if job.write_files_later is not None and job.error is None:
            try:
                job.write_files_later(job.directory)
            except Exception as error:  # reported, training goes on
                job.fail_in_flight(f"cannot write the checkpoint's small files: {error!r}")
        with self._finish_lock:
            self._committer.settle(job)
            self._jobs.complete(job)

    def _install_file(self, job: InFlightCheckpoint) -> None:
        """Renames a ``save_file`` file onto its path, unless a newer save of it is there."""
        tmp = job.directory / job.plan.files[0].name
        if job.error is None:
            # Superseded (the platform's fence names a later attempt): nothing lands on its path.
            job.error = _format.superseded_message(f"writes nothing to {job.target}")
        if job.error is None:
            with self._file_lock:
                if job.seq > self._installed.get(job.target, -1):
                    try:
                        os.replace(tmp, job.target)
                        self._installed[job.target] = job.seq
                    except OSError as error:
                        job.error = f"cannot rename {tmp} to {job.target}: {error}"
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)  # failed, or superseded by a newer save of the path

    # ---- seal (ckptlib._guard) ---------------------------------------------------------------

    def _seal_at_hook(self, force: bool) -> None:
        # After a forced run (the pre-step hook) every checkpoint's copies are taken; else only
        # those of the checkpoints fully staged.
        self._seal_jobs(all_read=force)

    def _seal_jobs(self, *, all_read: bool) -> None:
        for job in self._jobs.in_flight():
            if job.guard is not None and (all_read or job.staged.is_set()):
                self._seal(job)

    def _seal(self, job: InFlightCheckpoint) -> None:
        guard = job.guard
        if guard is None:
            return

        def changed(label: str) -> None:
            what = f"step {job.step}" if not job.external else str(job.target)
            message = (
                f"{label} was changed in place after save() returned and before its copy was taken: "
                f"the checkpoint ({what}) is not committed; from now on save() copies every tensor before it returns"
            )
            job.fail_in_flight(message)
            self._copy_now = True
            logger.warning("%s %s", LOG_PREFIX, message)

        guard.seal(on_change=changed)

    def _memory_alignment(self) -> int:
        """The direct-I/O memory alignment under ``root`` (probed once per filesystem)."""
        if self._mem_align is None:
            try:
                self.root.mkdir(parents=True, exist_ok=True)
            except OSError:
                return PAGE  # save reports the directory it cannot create
            self._mem_align = memory_alignment(self.root)
        return self._mem_align

    def _is_known_step(self, step: int) -> bool:
        if self._jobs.has_step(step):
            return True
        return (_format.committed_dir(self.root, step) / _format.MANIFEST_NAME).exists()
