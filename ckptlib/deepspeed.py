"""ckptlib behind DeepSpeed's checkpoint-engine interface.

DeepSpeed writes its checkpoints through ``engine.checkpoint_engine`` (``create``, ``save``,
``load``, ``commit``, …; ``deepspeed/runtime/checkpoint_engine/checkpoint_engine.py``).
``use_ckptlib(ds_engine)`` puts a ``DeepSpeedCheckpointEngine`` there: every file of
``ds_engine.save_checkpoint(dir, tag)`` (``mp_rank_00_model_states.pt``,
``zero_pp_rank_*_optim_states.pt``, …) is written by ckptlib in the background, in the same
``torch.save`` format, so ``load_checkpoint`` and DeepSpeed's own tools read it. The engine is
*decoupled*: ``save_checkpoint`` returns at once, and DeepSpeed calls ``commit`` at the next
``ds_engine.step()``, before the optimizer step; ``commit`` waits until the files are durable,
then DeepSpeed writes ``latest``. A crash before that leaves ``latest`` on the previous tag.

Before ``commit`` returns, each rank records the files it wrote into a tag, with their sizes and
sampled CRC-32s, in ``<tag>/ckptlib-rank<r>.json`` (``ckptlib.json``'s format): ``load`` checks a
file against it before reading it (a truncated or changed file is a ``CheckpointError`` naming
it), and the Trainer integration skips a damaged checkpoint when it resumes.

DeepSpeed's own ``"datastates_ckpt": {"enabled": true}`` setting instantiates
``datastates.CheckpointEngine``; the vendor directory's ``datastates`` provides it from this
module (``DataStatesEngine``). DeepSpeed itself is not imported here.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import time
import weakref
from pathlib import Path
from typing import Any

import torch

from ckptlib._engine import FILE_TMP_SUFFIX, CheckpointEngine
from ckptlib._events import LOG_PREFIX
from ckptlib._format import fsync_path, write_bytes_durably
from ckptlib._layout import CHECKSUM_NAME, file_entry, file_problem, rank_manifest_name, superseded_message
from ckptlib._types import CheckpointError, CheckpointResult

logger = logging.getLogger(__name__)


class DeepSpeedCheckpointEngine:
    """DeepSpeed's ``CheckpointEngine`` interface, writing through ckptlib.

    Args:
        config_params: DeepSpeed's config object (kept for its interface; unused).
        host_cache_size: Bound of ckptlib's host cache, GB.
        parser_threads: Writer threads.
        engine: An existing ckptlib engine to write through (default: a new one).
    """

    def __init__(
        self,
        config_params: Any = None,
        *,
        host_cache_size: float = 50.0,
        parser_threads: int = 1,
        engine: CheckpointEngine | None = None,
    ) -> None:
        self.name = "ckptlib"
        self.config_params = config_params
        self._owns_engine = engine is None
        self.engine = engine or CheckpointEngine(host_cache_size=host_cache_size, parser_threads=parser_threads, handle_signals=False)
        self._commit_info: Any = None
        self._started: float | None = None
        # The files saved since the last commit (a path saved twice once), for the rank's manifest.
        self._saved: dict[Path, None] = {}

    # ---- DeepSpeed's interface --------------------------------------------------------------

    def create(self, info: Any) -> None:
        self._commit_info = info

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict: Any, path: str) -> None:
        if self._started is None:
            self._started = time.perf_counter()
        self.engine.save_file(state_dict, path)
        self._saved[Path(path).absolute()] = None

    def load(self, path: str, map_location: Any = None) -> Any:
        """Reads a file DeepSpeed asks for, once its rank manifest (if one lists it) agrees.

        Raises:
            CheckpointError: The file's size or sampled checksum differs from the manifest's,
                or it cannot be read as a ``torch.save`` file; the message names the file.
        """
        self.engine.wait(persist=True)
        problem = file_problem(Path(path).absolute())
        if problem is not None:
            raise CheckpointError(f"damaged checkpoint file: {problem}")
        try:
            return torch.load(path, map_location=map_location, weights_only=False)
        except (OSError, RuntimeError, EOFError, ValueError) as error:
            raise CheckpointError(f"cannot load {path}: {error}") from error

    def commit(self, info: Any) -> bool:
        """Waits until every file saved so far is durable, then logs ckptlib's commit line
        (the step is the number ending the tag, as in ``global_step<N>``).

        A file that could not be written, or whose state changed in place before its copy was
        taken (``ckptlib._guard``), fails the checkpoint: the error is logged, ``info.save_latest``
        is cleared so DeepSpeed leaves ``latest`` on the previous tag, and False is returned
        (training goes on; DeepSpeed ignores the value).

        Raises:
            CheckpointError: A checkpoint failed and ``info`` has no ``save_latest`` to clear.
        """
        results = self.engine.wait(persist=True)
        started, self._started = self._started, None
        saved, self._saved = list(self._saved), {}
        failed = [result for result in results if not result.committed]
        fenced = superseded_message("commits no checkpoint") if self.engine.place.rank == 0 else None
        if not failed and not fenced:
            try:
                self._write_manifests(saved)
            except OSError as write_error:
                failed = [CheckpointResult(step=-1, path="", bytes=0, blocking_s=0.0, persist_s=0.0, committed=False,
                                           error=f"cannot record the files written: {write_error}")]  # fmt: skip
        if failed or fenced:
            error = fenced or failed[0].error
            message = f"{LOG_PREFIX} checkpoint {getattr(info, 'tag', '')!s} failed: {error}"
            if not hasattr(info, "save_latest"):
                raise CheckpointError(message)
            info.save_latest = False
            logger.error("%s; latest is left on the previous checkpoint", message)
            return False
        step = re.search(r"(\d+)$", str(getattr(info, "tag", "")))
        if results and step and self.engine.place.rank == 0:
            event = CheckpointResult(
                step=int(step.group(1)),
                path=os.path.join(str(info.save_dir), str(info.tag)),
                bytes=sum(result.bytes for result in results),
                blocking_s=sum(result.blocking_s for result in results),
                persist_s=time.perf_counter() - (started or time.perf_counter()),
                committed=True,
            )
            logger.info(event.log_line())
        return True

    def _write_manifests(self, saved: list[Path]) -> None:
        """Records this rank's files of each directory it wrote (sizes, sampled CRC-32s) in that
        directory's ``ckptlib-rank<r>.json``, durably, before DeepSpeed writes ``latest``."""
        by_directory: dict[Path, list[Path]] = {}
        for path in saved:
            by_directory.setdefault(path.parent, []).append(path)
        for directory, paths in by_directory.items():
            entries = {path.name: file_entry(path) for path in paths}
            manifest = {
                "rank": self.engine.place.rank,
                "files": {name: size for name, (size, _) in entries.items()},
                "checksum": CHECKSUM_NAME,
                "checksums": {name: crc for name, (_, crc) in entries.items()},
            }
            payload = json.dumps(manifest, indent=1, sort_keys=True).encode()
            name = rank_manifest_name(self.engine.place.rank)
            tmp = directory / f"{name}{FILE_TMP_SUFFIX}-{os.getpid()}"
            write_bytes_durably(tmp, payload)
            os.replace(tmp, directory / name)  # a reader sees the old list or the new one, whole
            fsync_path(directory)

    def is_data_parallel_writer(self, dp_rank: int) -> bool:
        return dp_rank == 0

    def is_decoupled(self) -> bool:
        return True

    def set_commit_info(self, info: Any) -> None:
        self._commit_info = info

    def get_commit_info(self) -> Any:
        """The checkpoint to commit at this step (each one once), or None."""
        info, self._commit_info = self._commit_info, None
        return info

    def cleanup(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()
        else:
            self.engine.wait(persist=True)

    def preserves_storage_sharing(self) -> bool:
        # Tensors sharing a storage are written once, as torch.save does.
        return True


def use_ckptlib(ds_engine: Any, **options: Any) -> DeepSpeedCheckpointEngine:
    """Makes ``ds_engine`` (from ``deepspeed.initialize``) checkpoint through ckptlib.

    Its optimizer is watched, so staging finishes before each optimizer step and
    ``save_checkpoint`` returns without copying the state. The last save, which DeepSpeed would
    commit only at a next ``step()``, is committed (``latest`` written) by ``ds_engine.destroy()``
    and at interpreter exit.

    Args:
        ds_engine: The DeepSpeed engine.
        options: ``DeepSpeedCheckpointEngine`` options (``engine=`` an existing ckptlib engine).

    Returns:
        The installed checkpoint engine.
    """
    current = getattr(ds_engine, "checkpoint_engine", None)
    if isinstance(current, DeepSpeedCheckpointEngine):
        return current
    adapter = DeepSpeedCheckpointEngine(getattr(ds_engine, "_config", None), **options)
    optimizer = getattr(ds_engine, "optimizer", None)
    if optimizer is not None:
        module = getattr(ds_engine, "module", None)
        stepped = (module,) if isinstance(module, torch.nn.Module) else ()
        adapter.engine.watch(optimizer, stepped_modules=stepped)
    ds_engine.checkpoint_engine = adapter
    _commit_at_destroy_and_exit(ds_engine)
    return adapter


def _commit_at_destroy_and_exit(ds_engine: Any) -> None:
    """DeepSpeed commits a decoupled save only at its next ``step()``: the last save of a run
    would never get ``latest``. ``destroy()`` and interpreter exit commit it first."""
    engine_ref = weakref.ref(ds_engine)
    destroy = getattr(ds_engine, "destroy", None)
    if callable(destroy):

        def destroy_after_commit(*args: Any, **kwargs: Any) -> Any:
            engine = engine_ref()
            if engine is not None:
                commit_pending(engine)
            return destroy(*args, **kwargs)

        object.__setattr__(ds_engine, "destroy", destroy_after_commit)

    def commit_at_exit() -> None:
        engine = engine_ref()
        if engine is not None:
            try:
                commit_pending(engine)
            except Exception:  # at exit: reported, never raised
                logger.exception("%s committing the last checkpoint at exit failed", LOG_PREFIX)

    atexit.register(commit_at_exit)


def commit_pending(ds_engine: Any) -> None:
    """Commits a checkpoint DeepSpeed would otherwise commit only at its next step (used at
    the end of training and for the final checkpoint on SIGTERM)."""
    commit = getattr(ds_engine, "_commit_decoupled_checkpoint", None)
    engine = getattr(ds_engine, "checkpoint_engine", None)
    if commit is not None and isinstance(engine, DeepSpeedCheckpointEngine) and engine._commit_info is not None:
        commit()


class DataStatesEngine:
    """What DeepSpeed's ``datastates_ckpt`` setting builds: ``CheckpointEngine(config, rank)``
    with ``save(state_dict, path)``, ``load(path, map_location)`` and ``wait(persist)``.

    DeepSpeed gives it no optimizer, so each ``save`` stages before it returns (its writes still
    run in the background); ``use_ckptlib`` avoids that copy.
    """

    def __init__(self, deepspeed_config: Any = None, rank: int = 0) -> None:
        options = getattr(getattr(deepspeed_config, "datastates_config", None), "config", None) or {}
        engine = CheckpointEngine(
            host_cache_size=float(options.get("host_cache_size", 50.0)),
            parser_threads=int(options.get("parser_threads", 1)),
            pin_host_cache=bool(options.get("pin_host_cache", True)),
            rank=rank,
            handle_signals=False,
        )
        self._adapter = DeepSpeedCheckpointEngine(deepspeed_config, engine=engine)
        self.engine = engine

    def save(self, state_dict: Any, path: str) -> None:
        self._adapter.save(state_dict, path)

    def load(self, path: str, map_location: Any = None) -> Any:
        return self._adapter.load(path, map_location)

    def wait(self, persist: bool = True) -> None:
        if persist:
            self._adapter.commit(None)
        else:
            self.engine.wait(persist=False)
