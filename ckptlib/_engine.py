"""The asynchronous checkpoint engine: stage → persist → commit.

Order of calls for one checkpoint:

1. ``save(state, step=…)`` (training thread): plans each file as its bytes in order (see
   ``ckptlib._plan``), clones or serializes what forward or user code may change (buffers,
   scheduler, RNG, plain values), queues the checkpoint for staging, stages a first part and
   returns.
2. Staging (``ckptlib._stage``), on the training thread at hook points (module forward
   pre-hooks, parameters' post-accumulate-grad hooks, the optimizer's pre-step hook): page-
   aligned CPU tensor ranges go to the writers as they are (no copy); everything else is copied
   into host-cache chunks, a few chunks ahead of the writers. The next ``optimizer.step()``
   waits until nothing of the checkpoint still needs the live tensors: it is the only thing that
   changes them.
3. ``parser_threads`` writer threads: write each item into ``checkpoint-<step>.tmp/`` with direct
   I/O (``ckptlib._writer``), give chunks back, fsync each finished file; the last one marks
   this rank done. When training reaches no hook point for a while, they stage in its place.
4. Rank 0 commits once every rank is done (see ``ckptlib._format``) and logs one line.
5. ``wait(persist=True)`` / ``shutdown()`` block until the checkpoints in flight are committed.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import ckptlib._format as _format
import ckptlib._signals as _signals
from ckptlib._cache import HostCache
from ckptlib._config import RuntimeConfig
from ckptlib._dist import ProcessPlace, current_place
from ckptlib._events import LOG_PREFIX, install_console_handler
from ckptlib._plan import StatePlan, plan_object, plan_state, restore_rng_state, unwrap_optimizer
from ckptlib._reader import read_checkpoint
from ckptlib._stage import Stager
from ckptlib._types import CheckpointError, CheckpointResult, LoadedCheckpoint
from ckptlib._writer import FileSink, WriteItem

logger = logging.getLogger(__name__)

_COMMIT_TIMEOUT_S = float(os.environ.get("CKPT_COMMIT_TIMEOUT_S", "600"))
_POLL_S = 0.01
_IDLE_STAGING_S = 0.2
# How long shutdown waits for each writer thread to return once everything in flight is done.
_JOIN_TIMEOUT_S = 5.0


class _StagingHook:
    """A hook that lets the engine stage a little (or, ``force``, everything left).

    It holds the engine weakly, and pickles and copies as a no-op, so models and optimizers
    carrying it stay picklable.
    """

    def __init__(self, engine: CheckpointEngine | None, *, force: bool = False) -> None:
        self._engine = weakref.ref(engine) if engine is not None else None
        self._force = force

    def __call__(self, *_args: Any, **_kwargs: Any) -> None:
        engine = self._engine() if self._engine is not None else None
        if engine is not None:
            try:
                engine._stage_at_hook(force=self._force)
            except Exception:  # noqa: BLE001 - a checkpoint must never break the training step
                logger.exception("%s staging failed", LOG_PREFIX)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_StagingHook, (None,), {"_force": self._force})


@dataclass(eq=False)
class _Job:
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
    ) -> None:
        install_console_handler()
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
        self.place: ProcessPlace = current_place(local_rank=rank)
        self.cache = HostCache(limit_bytes=self.options.host_cache_bytes, pin=pin_host_cache)
        self.final_state = final_state
        # Set by an integration that takes the final checkpoint at a step boundary itself.
        self.defer_final_checkpoint = False
        # Set by an integration whose final checkpoint is more than a state (Trainer's extra files).
        self.final_save: Callable[[], None] | None = None
        self.stop_requested = threading.Event()
        self.on_commit: list[Callable[[CheckpointResult], None]] = []

        self._jobs: list[_Job] = []
        self._jobs_lock = threading.Lock()
        self._results: list[CheckpointResult] = []
        self._unreported: list[CheckpointResult] = []
        self._commit_lock = threading.Lock()
        self._write_queue: queue.Queue[WriteItem | None] = queue.Queue()
        # Chunks kept ahead of the writers at ordinary staging points.
        self._window_bytes = min(self.cache.limit_bytes, max(4, 2 * parser_threads) * self.cache.chunk_bytes)
        self._stager = Stager(self.cache, window_bytes=self._window_bytes, hand_over=self._write_queue.put)
        # Chunks kept for reuse (a fresh chunk costs page faults): the window, and room for what
        # the pre-step hook copies of live ranges the disk has not reached (0.12–0.2 s at that
        # hook with 2 windows kept, 0.09 s with 4, for a 2 GB state on the development VM).
        self._keep_bytes = 4 * self._window_bytes
        self._hooked: weakref.WeakSet[Any] = weakref.WeakSet()
        self._hooked_points: set[str] = set()
        self._hook_handles: list[Any] = []
        self._closed = False

        if self.place.rank == 0:
            _format.remove_stale_tmp_dirs(self.root)
        self._threads = [
            threading.Thread(target=self._write_loop, name=f"ckptlib-writer-{i}", daemon=True)
            for i in range(parser_threads)
        ]
        for thread in self._threads:
            thread.start()
        if handle_signals:
            _signals.register(self)

    # ---- public API -------------------------------------------------------------------------

    def save(
        self,
        state: Mapping[str, Any],
        *,
        step: int,
        sharded: bool = False,
        capture_rng: bool = True,
        write_extra_files: Callable[[Path], None] | None = None,
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

        Returns:
            True if a checkpoint was started; False if ``step`` is already saved or could not
            be started (the error is logged and training goes on).
        """
        if self._closed:
            raise CheckpointError("the checkpoint engine is shut down")
        began = time.perf_counter()
        if self._is_known_step(step):
            logger.debug("%s step %s is already saved or in flight; skipped", LOG_PREFIX, step)
            return False
        directory, target = _format.tmp_dir(self.root, step), _format.committed_dir(self.root, step)
        write_state = sharded or self.place.rank == 0
        try:
            plan = plan_state(
                state,
                rank=self.place.rank,
                world_size=self.place.world_size,
                write_state=write_state,
                sharded=sharded,
                capture_rng=capture_rng,
            )
        except Exception as error:  # noqa: BLE001 - reported, training goes on
            job = _Job(step=step, directory=directory, target=target, plan=StatePlan(), started=began)
            self._fail(job, f"cannot plan the checkpoint: {error}")
            return False
        job = _Job(step=step, directory=directory, target=target, plan=plan, started=began)
        job.files_left = len(plan.files)
        try:
            directory.mkdir(parents=True, exist_ok=True)
            if write_extra_files is not None:
                write_extra_files(directory)
        except Exception as error:  # noqa: BLE001 - reported, training goes on
            self._fail(job, f"cannot create {directory}: {error}")
            return False
        for optimizer in plan.optimizers:
            self.watch(optimizer)
        self._hook_forward_passes()
        with self._jobs_lock:
            self._jobs.append(job)
        if not job.plan.files:
            # A rank with nothing to write still reports done, so rank 0 can commit.
            job.staged.set()
            threading.Thread(target=self._finish, args=(job,), name="ckptlib-commit", daemon=True).start()
        else:
            self._stager.add(job, live=bool(plan.optimizers))
            # Without an optimizer nothing tells us when the tensors change: stage all now.
            self._stager.run(force=not plan.optimizers)
        job.blocking_s += time.perf_counter() - began
        return True

    def save_file(self, obj: Any, path: str | os.PathLike[str]) -> None:
        """Writes ``obj`` as a ``torch.save`` file at ``path``, in the background.

        For callers that lay out and commit their checkpoints themselves (DeepSpeed's
        checkpoint-engine interface, ``ckptlib.deepspeed``): no ``concurrent_checkpoint/``
        directory, no manifest, no ``latest``. The file is whole and durable (fsynced, and its
        directory too) once ``wait(persist=True)`` returns; a failure is reported there. Its
        tensors are staged before the next step of an optimizer given to ``watch``, or before
        this returns when none is watched.
        """
        if self._closed:
            raise CheckpointError("the checkpoint engine is shut down")
        began = time.perf_counter()
        target = Path(path)
        watched = any(isinstance(candidate, torch.optim.Optimizer) for candidate in self._hooked)
        plan = StatePlan(files=[plan_object(target.name, obj, background=True)])
        job = _Job(step=-1, directory=target.parent, target=target, plan=plan, started=began, external=True)
        job.files_left = 1
        self._hook_forward_passes()
        with self._jobs_lock:
            self._jobs.append(job)
        self._stager.add(job, live=watched)
        self._stager.run(force=not watched)
        job.blocking_s += time.perf_counter() - began

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
        with self._jobs_lock:
            jobs = list(self._jobs)
        deadline = None if timeout is None else time.monotonic() + timeout
        for job in jobs:
            event = job.done if persist else job.staged
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            event.wait(remaining)
        if not persist:
            return []
        with self._jobs_lock:
            reported, self._unreported = self._unreported, []
        return reported

    def staging_stats(self) -> dict[str, int]:
        """Bytes this engine copied into the host cache, and bytes it wrote straight from live
        tensors (page-aligned CPU tensors: ``THP_MEM_ALLOC_ENABLE=1``), since it started."""
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
        return tuple(self._results)

    def load(
        self,
        step: int | None = None,
        *,
        into: Mapping[str, Any] | None = None,
        restore_rng: bool | None = None,
        map_location: str | torch.device = "cpu",
    ) -> LoadedCheckpoint:
        """Reads a committed checkpoint.

        Args:
            step: The step; None or -1 for the latest committed one.
            into: Live objects to ``load_state_dict`` into, by key (as given to ``save``).
            restore_rng: Restore the RNG states; default: when ``into`` is given.
            map_location: Where tensors of ``.pt`` files go.

        Returns:
            The checkpoint.

        Raises:
            CheckpointError: No such committed checkpoint.
        """
        if step is None or step == -1:
            step = self.latest_step()
            if step is None:
                raise CheckpointError(f"no committed checkpoint under {self.root}")
        loaded = read_checkpoint(_format.committed_dir(self.root, step), place=self.place, map_location=map_location)
        if into:
            for key, target in into.items():
                if key in loaded.state and hasattr(target, "load_state_dict"):
                    target.load_state_dict(loaded.state[key])
        if (into is not None if restore_rng is None else restore_rng) and "rng_state" in loaded.state:
            restore_rng_state(loaded.state["rng_state"])
        return loaded

    def shutdown(self, *, timeout: float | None = None) -> None:
        """Waits for the checkpoints in flight to persist, then stops the threads."""
        if self._closed:
            return
        self.wait(persist=True, timeout=timeout)
        self._closed = True
        for handle in self._hook_handles:
            handle.remove()
        self._hook_handles.clear()
        for _ in range(self.options.parser_threads):
            self._write_queue.put(None)
        # Joined, not left to die with the interpreter: a daemon thread still inside a torch call
        # that released the GIL when Python finalizes aborts the process ("terminate called
        # without an active exception", pytorch/pytorch#38228).
        with self._jobs_lock:
            settled = not self._jobs  # a job leaves the list when it completes
        for thread in self._threads:
            if thread is not threading.current_thread():
                # Past the timeout (a grace period ran out) they may still be writing: don't wait.
                thread.join(timeout=_JOIN_TIMEOUT_S if settled else 0)
        self.cache.clear()
        _signals.unregister(self)

    def final_checkpoint(self) -> None:
        """Takes the final checkpoint (if ``final_state`` is set) and waits for it, within the grace."""
        if self._closed:
            return
        try:
            if self.final_save is not None:
                self.final_save()
            elif self.final_state is not None:
                state, step = self.final_state()
                if state:
                    self.save(state, step=step)
        except Exception:
            logger.exception("%s final checkpoint could not be started", LOG_PREFIX)
        self.wait(persist=True, timeout=self.options.grace_period_s)

    # ---- stage ------------------------------------------------------------------------------

    def watch(self, optimizer: torch.optim.Optimizer) -> None:
        """Stages at ``optimizer``'s steps and its parameters' gradient accumulation.

        Before each step, everything still unstaged is staged (the step waits): the step is the
        only thing that changes parameters and optimizer state. ``save`` calls this for the
        optimizers in its state.
        """
        optimizer = unwrap_optimizer(optimizer) or optimizer
        if optimizer in self._hooked:
            return
        self._hooked.add(optimizer)
        self._hook_handles.append(optimizer.register_step_pre_hook(_StagingHook(self, force=True)))
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.requires_grad and parameter not in self._hooked:
                    self._hooked.add(parameter)
                    hook = _StagingHook(self, force=False)
                    self._hook_handles.append(parameter.register_post_accumulate_grad_hook(hook))

    def _hook_forward_passes(self) -> None:
        if "forward" not in self._hooked_points:
            self._hooked_points.add("forward")
            hook = _StagingHook(self, force=False)
            self._hook_handles.append(torch.nn.modules.module.register_module_forward_pre_hook(hook))

    def _stage_at_hook(self, *, force: bool) -> None:
        if self._stager.idle:
            return
        with self._jobs_lock:
            pending = [job for job in self._jobs if not job.staged.is_set()]
        began = time.perf_counter()
        if self._stager.run(force=force) and pending:
            pending[0].blocking_s += time.perf_counter() - began

    def _write_loop(self) -> None:
        while True:
            try:
                # Poll only while a checkpoint is staging: an idle thread waking 20 times a second
                # measurably slowed a 2-core training loop (its steps took 7 % longer).
                item = self._write_queue.get(timeout=None if self._stager.idle else _POLL_S * 5)
            except queue.Empty:
                if not self._stager.idle and time.monotonic() - self._stager.last_run > _IDLE_STAGING_S:
                    # Training has not reached a staging point for a while: stage in its place.
                    self._stager.run(force=False)
                continue
            if item is None:
                return
            self._write(item)

    def _write(self, item: WriteItem) -> None:
        job, sink = item.job, item.sink
        if item.end:
            if sink.end():
                self._close_file(job, sink)
            return
        if item.chunk is not None or item.live is not None:
            live_ok = item.live is None or self._stager.begin_live_write(item)
            try:
                if item.ready is not None:
                    item.ready.synchronize()
                if job.error is None and live_ok:
                    sink.write(item)
                    with job.lock:
                        job.bytes += item.length
            except Exception as error:  # noqa: BLE001 - reported, training goes on
                self._fail_in_flight(job, f"writing {sink.path.name} failed: {error}")
            finally:
                if item.chunk is not None:
                    self.cache.release(item.chunk, keep_bytes=self._keep_bytes)
                if item.live is not None:
                    self._stager.end_live_write(item)
        if sink.done_one():
            self._close_file(job, sink)

    def _close_file(self, job: _Job, sink: FileSink) -> None:
        try:
            sink.close(durable=job.error is None)
        except Exception as error:  # noqa: BLE001
            self._fail_in_flight(job, f"writing {sink.path.name} failed: {error}")
        with job.lock:
            job.files_left -= 1
            last = job.files_left == 0
        if last:
            self._finish(job)

    def _finish(self, job: _Job) -> None:
        if job.external:
            try:
                if job.error is None:
                    _format.fsync_path(job.directory)
            except OSError as error:
                job.error = f"commit failed: {error}"
            self._complete(job)
            return
        try:
            if job.error is None:
                self._mark_rank_done(job)
                if self.place.rank == 0:
                    self._commit(job)
                else:
                    self._await_commit(job)
        except Exception as error:  # noqa: BLE001
            job.error = job.error or f"commit failed: {error}"
        if job.error is not None:
            self._mark_rank_failed(job)
            if self.place.rank == 0:
                _format.remove_tree(job.directory)
        self._complete(job)

    def _mark_rank_done(self, job: _Job) -> None:
        for path in job.directory.iterdir():
            if path.is_file() and not path.name.startswith("."):
                _format.fsync_path(path)
        _format.write_bytes_durably(_format.rank_marker(job.directory, self.place.rank), b"ok\n")

    def _mark_rank_failed(self, job: _Job) -> None:
        try:
            (job.directory / f".rank-{self.place.rank}.failed").write_text(job.error or "failed")
        except OSError:
            pass

    def _commit(self, job: _Job) -> None:
        deadline = time.monotonic() + _COMMIT_TIMEOUT_S
        for rank in range(1, self.place.world_size):
            while not _format.rank_marker(job.directory, rank).exists():
                failed = job.directory / f".rank-{rank}.failed"
                if failed.exists():
                    raise CheckpointError(f"rank {rank} failed: {failed.read_text()}")
                if time.monotonic() > deadline:
                    raise CheckpointError(f"rank {rank} did not finish within {_COMMIT_TIMEOUT_S:.0f}s")
                time.sleep(_POLL_S)
        files = {
            path.name: path.stat().st_size
            for path in sorted(job.directory.iterdir())
            if path.is_file() and not path.name.startswith(".")
        }
        manifest = {
            "format": _format.FORMAT_VERSION,
            "step": job.step,
            "world_size": self.place.world_size,
            "keys": job.plan.keys,
            "files": files,
            "bytes": sum(files.values()),
            "committed_at": time.time(),
        }
        _format.write_manifest(job.directory, manifest)
        for marker in job.directory.glob(".rank-*"):
            marker.unlink(missing_ok=True)
        with self._commit_lock:
            _format.commit(self.root, job.step)

    def _await_commit(self, job: _Job) -> None:
        deadline = time.monotonic() + _COMMIT_TIMEOUT_S
        while not (job.target / _format.MANIFEST_NAME).exists():
            if time.monotonic() > deadline:
                raise CheckpointError(f"rank 0 did not commit step {job.step} within {_COMMIT_TIMEOUT_S:.0f}s")
            if self._closed:
                return
            time.sleep(_POLL_S)

    def _complete(self, job: _Job) -> None:
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
        self._results.append(result)
        if job.external:
            if not result.committed:
                logger.error("%s writing %s failed: %s", LOG_PREFIX, job.target, job.error)
        elif result.committed:
            if self.place.rank == 0:
                logger.info(result.log_line())
            for callback in self.on_commit:
                try:
                    callback(result)
                except Exception:  # noqa: BLE001 - rotation must not break training
                    logger.exception("%s after-commit callback failed", LOG_PREFIX)
        else:
            logger.error("%s checkpoint step=%s failed: %s", LOG_PREFIX, job.step, job.error)
        with self._jobs_lock:
            self._unreported.append(result)
            if job in self._jobs:
                self._jobs.remove(job)
        job.done.set()

    def _fail_in_flight(self, job: _Job, message: str) -> None:
        with job.lock:
            if job.error is None:
                job.error = message

    def _fail(self, job: _Job, message: str) -> None:
        job.error = message
        job.staged.set()
        if self.place.rank == 0:
            _format.remove_tree(job.directory)
        self._complete(job)

    def _is_known_step(self, step: int) -> bool:
        with self._jobs_lock:
            if any(job.step == step for job in self._jobs):
                return True
        return (_format.committed_dir(self.root, step) / _format.MANIFEST_NAME).exists()
