"""``DecoratedCheckpointing``: routes a Hugging Face Trainer's checkpoints through the engine.

Decorating a trainer changes three things on that instance only:

* ``_save_checkpoint`` (periodic saves from ``save_strategy`` / ``save_steps``) hands the state
  to the engine, into ``<output_dir>/concurrent_checkpoint/checkpoint-<step>/`` with the
  Trainer's own file names; ``save_total_limit`` rotates committed checkpoints only.
* ``train(resume_from_checkpoint=True)`` resolves to the latest committed checkpoint, or to
  ``CKPT_LAST_STEP`` when that names one; with none it logs and starts from scratch.
* a callback takes the final checkpoint at the end of the step during which SIGTERM arrived;
* with ``CKPT_SNAPSHOT_DIR`` set, a callback snapshots the same state into memory at the end of
  each step (``ckptlib._snapshot``), and ``resume_from_checkpoint=True`` on a failover attempt
  resumes from this rank's replica when ``CKPT_LAST_STEP`` is not committed on disk.

``transformers`` is imported only when a trainer is given.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

import ckptlib._format as _format
import ckptlib._signals as _signals
from ckptlib._config import parse_runtime_config
from ckptlib._engine import CheckpointEngine
from ckptlib._events import LOG_PREFIX
from ckptlib._layout import read_small_file, tag_problem
from ckptlib._plan import capture_rng_state
from ckptlib._snapshot import resume_replica, snapshot_settings
from ckptlib._types import CheckpointResult
from ckptlib.deepspeed import commit_pending, use_ckptlib

logger = logging.getLogger(__name__)
# The service's guide shows ``ERROR:datastates.llm.decorator:[Concurrent Checkpoint] No Checkpoint
# found with step: -1``: that line also goes to this logger, which propagates to the script's own
# logging setup; where the script set none up, a handler in that format prints it.
guide_logger = logging.getLogger("datastates.llm.decorator")


class _RootUnconfigured(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not logging.getLogger().handlers


def _install_guide_handler() -> None:
    if any(getattr(h, "_ckptlib_guide", False) for h in guide_logger.handlers):
        return
    handler = logging.StreamHandler()  # sys.stderr at emit time, as logging.basicConfig's
    handler._ckptlib_guide = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    handler.addFilter(_RootUnconfigured())
    guide_logger.addHandler(handler)


def _no_checkpoint_found(step: int) -> None:
    logger.error("%s No Checkpoint found with step: %s", LOG_PREFIX, step)
    _install_guide_handler()
    guide_logger.error("%s No Checkpoint found with step: %s", LOG_PREFIX, step)


_SIGTERM_EXIT_STATUS = 143


class DecoratedCheckpointing:
    """The service's checkpoint engine, as ``datastates.llm.DecoratedCheckpointing``.

    Args:
        runtime_config: ``host_cache_size`` (GB), ``parser_threads``, ``pin_host_cache``,
            optional ``grace_period_s``, and ``trainer`` to decorate. Unknown keys warn.
        rank: The launcher's local rank (``args.local_rank``, -1 when not launched).

    Raises:
        ValueError: A config value is invalid; the message names the key.
    """

    def __init__(self, runtime_config: Mapping[str, Any], rank: int = -1) -> None:
        options, trainer = parse_runtime_config(runtime_config)
        output_dir = getattr(getattr(trainer, "args", None), "output_dir", None)
        self.trainer = trainer
        self.engine = CheckpointEngine(
            output_dir=output_dir,
            host_cache_size=options.host_cache_size,
            parser_threads=options.parser_threads,
            pin_host_cache=options.pin_host_cache,
            copy_mode=options.copy_mode,
            rank=rank,
            grace_period_s=options.grace_period_s,
        )
        if trainer is not None:
            self._decorate(trainer)

    # The plain API, for scripts that also save by hand ("Trainer and save at the same time").
    def save(self, state: Mapping[str, Any], *, step: int, **options: Any) -> bool:
        return self.engine.save(state, step=step, **options)

    def snapshot(self, state: Mapping[str, Any], *, step: int, **options: Any) -> bool:
        """``CheckpointEngine.snapshot``: an in-memory snapshot, when ``CKPT_SNAPSHOT_DIR`` is set."""
        return self.engine.snapshot(state, step=step, **options)

    def load(self, step: int | None = None, **options: Any) -> Any:
        return self.engine.load(step, **options)

    def wait(self, persist: bool = False, *, timeout: float | None = None) -> list[CheckpointResult]:
        return self.engine.wait(persist, timeout=timeout)

    def latest_step(self) -> int | None:
        return self.engine.latest_step()

    def shutdown(self, *, timeout: float | None = None) -> None:
        self.engine.shutdown(timeout=timeout)

    def resolve_resume(self, resume_from_checkpoint: Any) -> Any:
        """Maps ``train``'s ``resume_from_checkpoint`` to a checkpoint directory.

        ``True`` → ``CKPT_LAST_STEP``'s checkpoint when it names a committed one, else (on a
        failover attempt, ``CKPT_RESUME_ROOT`` set) this rank's in-memory replica of that step when
        whole, else the latest committed one, else None (from scratch, with the documented error
        line). Paths and False/None pass through.
        """
        if resume_from_checkpoint is not True:
            return resume_from_checkpoint
        requested = _requested_step()
        directory: Callable[[int], Path]
        if self._deepspeed:
            # DeepSpeed runs keep the Trainer's layout: <output_dir>/checkpoint-<step>/, committed
            # once DeepSpeed has written its `latest` file there (after ckptlib's commit).
            output_dir = Path(self.trainer.args.output_dir)
            steps = deepspeed_committed_steps(output_dir)
            directory = lambda step: output_dir / f"{_format.CHECKPOINT_PREFIX}{step}"  # noqa: E731
        else:
            root = self.engine.root
            steps = _format.committed_steps(root)
            directory = lambda step: _format.committed_dir(root, step)  # noqa: E731
        if requested != -1:
            if requested in steps:
                logger.info("%s resuming from %s", LOG_PREFIX, directory(requested))
                return str(directory(requested))
            replica = None if self._deepspeed else resume_replica(requested, rank=self.engine.place.rank)
            if replica is not None:
                return str(replica)
            _no_checkpoint_found(requested)
        latest = max(steps, default=None) if self._deepspeed else _format.read_latest(root)
        if latest is None:
            if requested == -1:
                _no_checkpoint_found(requested)
            return None
        path = str(directory(latest))
        logger.info("%s resuming from %s", LOG_PREFIX, path)
        return path

    # ---- decoration -------------------------------------------------------------------------

    def _decorate(self, trainer: Any) -> None:
        # Lazy: transformers is optional (the plain API and ``datastates.llm`` import this module
        # without it); a trainer to decorate means it is installed.
        from transformers import TrainerCallback

        self.engine.defer_final_checkpoint = True
        self.engine.final_save = self._final_save
        self.engine.on_commit.append(self._rotate)
        original_train = trainer.train

        def train(resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
            return original_train(self.resolve_resume(resume_from_checkpoint), *args, **kwargs)

        trainer.train = train
        decorator = self
        if self._deepspeed:
            # DeepSpeed's optimizer state is partitioned and only DeepSpeed can save it: the
            # Trainer's own save stays, and DeepSpeed writes its files through ckptlib.
            class DeepSpeedThroughCkptlib(TrainerCallback):
                def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                    use_ckptlib(trainer.model_wrapped, engine=decorator.engine)

                def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                    commit_pending(trainer.model_wrapped)
                    decorator._rotate_deepspeed()

            trainer.add_callback(DeepSpeedThroughCkptlib())
            trainer._save_checkpoint = self._save_checkpoint_rotating_after_commit(trainer._save_checkpoint)
        else:
            trainer._save_checkpoint = self._save_checkpoint

        class FinalCheckpointOnStop(TrainerCallback):
            """Saves at the end of the step in which SIGTERM arrived, then exits (status 143)."""

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                if decorator._stop_agreed():
                    _signals.mark_served()
                    decorator.engine.final_checkpoint(deadline=_signals.stop_deadline())
                    raise SystemExit(_SIGTERM_EXIT_STATUS)

        trainer.add_callback(FinalCheckpointOnStop())

        settings = snapshot_settings(rank=self.engine.place.rank)
        every = None if settings is None or self._deepspeed else settings.every  # DeepSpeed's partitioned state: no snapshots
        if every is not None:

            class SnapshotEachStep(TrainerCallback):
                """Snapshots the state a checkpoint holds into memory at the end of each step."""

                def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                    if state.global_step % every == 0:
                        decorator._snapshot_step()

            trainer.add_callback(SnapshotEachStep())

        class TrainerStepLine(TrainerCallback):
            """Logs the Trainer's ``global_step/max_steps`` with each of its log dicts.

            The Trainer prints its loss without a step, and its bar's redraws share a line with
            that dict (the console keeps a line's last redraw): this line is how a console reads
            the step a loss belongs to. First among the callbacks, so it precedes the dict.
            """

            def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
                if state.is_world_process_zero:
                    epoch = state.epoch if state.epoch is not None else 0.0
                    logger.info("%s trainer step=%d/%d epoch=%.4f", LOG_PREFIX, state.global_step, state.max_steps, epoch)

        trainer.callback_handler.callbacks.insert(0, TrainerStepLine())

    def _save_checkpoint_rotating_after_commit(self, original: Any) -> Any:
        """The Trainer's own save (DeepSpeed), without its immediate rotation.

        The Trainer rotates right after writing: with ``save_total_limit=1`` it would delete the
        last committed checkpoint while the new one is not committed yet (DeepSpeed writes its
        ``latest`` only at the next step). Rotation runs instead among committed checkpoints
        only: before the next save (by then the previous one is committed) and at the end of
        training, so at most ``save_total_limit`` + 1 directories exist for a while.
        """

        def save_checkpoint(model: Any, trial: Any) -> None:
            self._rotate_deepspeed()
            args = self.trainer.args
            limit = args.save_total_limit
            args.save_total_limit = None
            try:
                original(model, trial)
            finally:
                args.save_total_limit = limit

        return save_checkpoint

    def _rotate_deepspeed(self) -> None:
        args = self.trainer.args
        limit = args.save_total_limit
        if limit is None or limit <= 0 or not args.should_save:
            return
        fenced = _format.superseded_message("rotates nothing out")
        if fenced:
            logger.warning("%s %s", LOG_PREFIX, fenced)
            return
        output_dir = Path(args.output_dir)
        steps = deepspeed_committed_steps(output_dir, verify=False)
        best = self.trainer.state.best_model_checkpoint
        protected = {Path(best).resolve()} if best else set()
        removed = []
        for step in steps[: max(0, len(steps) - limit)]:
            path = output_dir / f"{_format.CHECKPOINT_PREFIX}{step}"
            if path.resolve() in protected:
                continue
            doomed = output_dir / f".deleting-{_format.CHECKPOINT_PREFIX}{step}"
            os.replace(path, doomed)  # never seen half deleted under its own name
            _format.remove_tree(doomed)
            removed.append(step)
        if removed:
            _format.fsync_path(output_dir)
            logger.info("%s rotated out steps %s (save_total_limit=%s)", LOG_PREFIX, removed, limit)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        trainer = self.trainer
        if trainer.hp_search_backend is None and trial is None:
            trainer.store_flos()
        step = trainer.state.global_step
        trainer_state = self._capture_trainer_state()
        started = self.engine.save(
            self._state_objects(),
            step=step,
            write_files_later=None if trainer_state is None else lambda directory: self._write_small_files(directory, trainer_state),
        )
        best_step = getattr(trainer.state, "best_global_step", None)
        if started and best_step:
            best = _format.committed_dir(self.engine.root, best_step)
            if best.exists() or best_step == step:
                trainer.state.best_model_checkpoint = str(best)

    def _snapshot_step(self) -> None:
        """What ``_save_checkpoint`` saves, as a snapshot of ``global_step``. Every rank writes
        its own ``trainer_state.json`` and RNG file under the Trainer's name for its rank: it
        resumes from its own replica."""
        trainer = self.trainer
        trainer_state = self._snapshot_trainer_state()
        rng_name = _format.rng_file_name(self.engine.place.rank, self.engine.place.world_size)
        self.engine.snapshot(
            self._state_objects(),
            step=trainer.state.global_step,
            capture_rng=False,
            write_extra_files=lambda directory: torch.save(capture_rng_state(), directory / rng_name),
            write_files_later=lambda directory: (directory / _format.TRAINER_STATE_FILE).write_text(trainer_state, encoding="utf-8"),
        )

    def _unwrapped_model(self) -> Any:
        """``accelerator.unwrap_model(trainer.model)``, computed once per wrapped model: accelerate
        reads package metadata on every call (~2-5 ms, twice per save)."""
        trainer = self.trainer
        cached = getattr(self, "_unwrap_cache", None)
        if cached is None or cached[0] is not trainer.model:
            cached = self._unwrap_cache = (trainer.model, trainer.accelerator.unwrap_model(trainer.model))
        return cached[1]

    def _state_objects(self) -> dict[str, Any]:
        trainer = self.trainer
        state: dict[str, Any] = {"model": self._unwrapped_model()}
        if not trainer.args.save_only_model:
            if trainer.optimizer is not None:
                state["optimizer"] = trainer.optimizer
            if trainer.lr_scheduler is not None:
                state["scheduler"] = trainer.lr_scheduler
            scaler = getattr(trainer.accelerator, "scaler", None)
            if scaler is not None:
                state["scaler"] = scaler
        return state

    def _capture_trainer_state(self) -> str | None:
        """``trainer_state.json`` as of this step (None: this rank writes no small files).

        Only this changes as training goes on; it is captured on the training thread, and the
        files are written later on a writer thread (``_write_small_files``).
        """
        trainer = self.trainer
        if not trainer.args.should_save:
            return None
        from transformers.trainer_callback import ExportableState  # lazy: transformers is optional

        # As Trainer._save_checkpoint does: callbacks' and control's state go into trainer_state.json.
        for callback in [*trainer.callback_handler.callbacks, trainer.control]:
            if isinstance(callback, ExportableState):
                name = callback.__class__.__name__
                if isinstance(trainer.state.stateful_callbacks.get(name), list):
                    trainer.state.stateful_callbacks[name].append(callback.state())
                else:
                    trainer.state.stateful_callbacks[name] = callback.state()
        # TrainerState.save_to_json's bytes, made now.
        return json.dumps(dataclasses.asdict(trainer.state), indent=2, sort_keys=True) + "\n"

    def _snapshot_trainer_state(self) -> str:
        """``trainer_state.json`` for a snapshot: as ``_capture_trainer_state`` makes it, but
        without adding to ``trainer.state`` (a list of one class's callback states would grow
        by one at every step)."""
        from transformers.trainer_callback import ExportableState  # lazy: transformers is optional

        trainer = self.trainer
        exported: dict[str, Any] = {}
        for callback in [*trainer.callback_handler.callbacks, trainer.control]:
            if isinstance(callback, ExportableState):
                name = callback.__class__.__name__
                if name in exported:  # several callbacks of one class: a list, as the Trainer keeps them
                    previous = exported[name]
                    exported[name] = [*(previous if isinstance(previous, list) else [previous]), callback.state()]
                else:
                    exported[name] = callback.state()
        state = dataclasses.asdict(trainer.state)
        state["stateful_callbacks"] = {**state["stateful_callbacks"], **exported}
        return json.dumps(state, indent=2, sort_keys=True) + "\n"

    def _write_small_files(self, directory: Path, trainer_state: str) -> None:
        """The Trainer's small files, on a writer thread before the commit: the captured
        ``trainer_state.json``, and what training does not change (arguments, model and
        generation config, tokenizer), as ``Trainer._save_checkpoint`` writes them."""
        trainer = self.trainer
        (directory / _format.TRAINER_STATE_FILE).write_text(trainer_state, encoding="utf-8")
        torch.save(trainer.args, directory / "training_args.bin")
        model = self._unwrapped_model()
        if getattr(model, "config", None) is not None and hasattr(model.config, "save_pretrained"):
            model.config.save_pretrained(directory)
        if getattr(model, "generation_config", None) is not None and hasattr(model, "can_generate") and model.can_generate():
            model.generation_config.save_pretrained(directory)
        if trainer.processing_class is not None:
            trainer.processing_class.save_pretrained(directory)

    def _rotate(self, result: CheckpointResult) -> None:
        limit = self.trainer.args.save_total_limit
        if limit is None or limit <= 0 or self.engine.place.rank != 0:
            return
        protect = [self.trainer.state.best_model_checkpoint] if self.trainer.state.best_model_checkpoint else []
        removed = _format.rotate(self.engine.root, keep=limit, protect=protect)
        if removed:
            logger.info("%s rotated out steps %s (save_total_limit=%s)", LOG_PREFIX, removed, limit)

    def _final_save(self) -> None:
        trainer = self.trainer
        if trainer.optimizer is not None and trainer.state.global_step > 0:
            if self._deepspeed and trainer.state.global_step in deepspeed_committed_steps(Path(trainer.args.output_dir), verify=False):
                return  # already saved: rewriting a committed DeepSpeed checkpoint in place is not safe
            trainer._save_checkpoint(trainer.model, None)
            if self._deepspeed:
                commit_pending(trainer.model_wrapped)

    @property
    def _deepspeed(self) -> bool:
        return bool(getattr(self.trainer, "is_deepspeed_enabled", False))

    def _stop_agreed(self) -> bool:
        """Whether any rank got SIGTERM; every rank must stop at the same step."""
        stop = self.engine.stop_requested.is_set()
        if self.engine.place.world_size > 1 and torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([int(stop)], device=self.trainer.args.device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop


def deepspeed_committed_steps(output_dir: Path, *, verify: bool = True) -> list[int]:
    """Steps of ``checkpoint-<step>/`` directories that hold DeepSpeed's ``latest`` file.

    With ``verify`` (resuming), a checkpoint whose tag (named by ``latest``) has a file that
    differs from its rank manifest's size or checksum is left out, with a warning naming the
    file (``_layout.tag_problem``); rotation and the final save's check list them all."""
    steps = []
    if output_dir.is_dir():
        for entry in output_dir.iterdir():
            suffix = entry.name.removeprefix(_format.CHECKPOINT_PREFIX)
            if not (entry.name.startswith(_format.CHECKPOINT_PREFIX) and suffix.isdigit() and (entry / "latest").is_file()):
                continue
            if verify:
                problem = _deepspeed_checkpoint_problem(entry)
                if problem is not None:
                    logger.warning("%s damaged checkpoint skipped: %s", LOG_PREFIX, problem)
                    continue
            steps.append(int(suffix))
    return sorted(steps)


def _deepspeed_checkpoint_problem(checkpoint: Path) -> str | None:
    try:
        tag = read_small_file(checkpoint / "latest", 4096).decode().strip()
    except (OSError, UnicodeDecodeError) as error:
        return f"{checkpoint}/latest: cannot be read ({error})"
    if not tag or "/" in tag or tag in {".", ".."}:
        return f"{checkpoint}/latest: names no tag ({tag!r})"
    return tag_problem(checkpoint / tag)


def _requested_step() -> int:
    value = os.environ.get("CKPT_LAST_STEP", "").strip()
    try:
        return int(value) if value else -1
    except ValueError:
        logger.warning("%s CKPT_LAST_STEP=%r is not a step; using the latest checkpoint", LOG_PREFIX, value)
        return -1
