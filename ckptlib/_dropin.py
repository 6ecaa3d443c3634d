"""Upstream DataStates' path-addressed API (``datastates.CheckpointEngine``,
``datastates.llm.Checkpointing``) over ckptlib's engine.

Order of calls (as upstream): ``save(state_dict, path)`` → training goes on → ``wait()`` (the
tensors may change again) → ``commit(tag)`` or ``wait(persist=True)`` (every file saved so far is
durable and in place) → ``load(path)`` → ``shutdown()``.

Same as upstream: the constructor ``(runtime_config, rank)`` with a dict or a DeepSpeed config
object (``config.datastates_config.config``), ``int(rank)``, the keys and defaults of
``ckptlib._config`` (``host_cache_size`` GB of ``2**30`` bytes, ``0`` = sized for you;
``parser_threads`` 4; ``pin_host_cache``; ``fast_cache_init``), ``save`` returning True, ``load``
returning the saved dict with its tensors, ``commit`` returning True.

Not the same, and why:

* The file format is ``torch.save``'s, not upstream's header + pickle layout: files written by
  upstream DataStates cannot be read here, nor the reverse.
* A save to ``path`` writes its own ``<path>.ckptlib-tmp-<pid>-<n>`` in the background and
  renames it onto ``path`` once it is durable (fsynced, directory too): ``path`` is never seen
  half written, and a save of a path still in flight replaces it (the newest save's content
  stays; no error). Upstream writes ``path`` in place.
* Errors raise (``CheckpointError``, ``TypeError``); upstream logs and calls ``sys.exit(-1)``.
* CUDA is not required (upstream raises without it).
* The tensors are copied before ``save`` returns (nothing here tells the engine when training
  changes them next), while the writes run in the background.
"""

from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ckptlib._config import parse_runtime_config
from ckptlib._engine import CheckpointEngine as _Engine
from ckptlib._inflight import InFlightCheckpoint
from ckptlib._types import CheckpointError

# Upstream's logger names: ``get_logger(__name__)`` in ``datastates/llm/checkpointing.py``.
logger = logging.getLogger("datastates.llm.checkpointing")

# DeepSpeed passes its own switch inside the same dict ("datastates_ckpt": {"enabled": true, …}).
_DEEPSPEED_KEYS = {"enabled"}


def datastates_config(runtime_config: Any) -> dict[str, Any]:
    """The DataStates options of a dict or of a DeepSpeed config object, as upstream reads them.

    Raises:
        TypeError: Neither a mapping nor an object with ``datastates_config``.
        ValueError: A DeepSpeed config whose ``datastates_config`` is not enabled.
    """
    if isinstance(runtime_config, Mapping):
        options = dict(runtime_config)
    elif hasattr(runtime_config, "datastates_config"):
        section = runtime_config.datastates_config
        if section is None or not getattr(section, "enabled", False):
            raise ValueError("DataStates is not enabled in the DeepSpeed config (datastates_ckpt)")
        options = dict(getattr(section, "config", None) or {})
    elif runtime_config is None:
        options = {}
    else:
        raise TypeError(f"runtime_config must be a dict or a DeepSpeed config, got {type(runtime_config).__name__}")
    for key in _DEEPSPEED_KEYS:
        options.pop(key, None)
    return options


class PathCheckpointing:
    """``Checkpointing(runtime_config, rank)``: saves dicts to paths in the background.

    Args:
        runtime_config: A dict of upstream's keys, or a DeepSpeed config object.
        rank: This process's rank; strings are accepted (``int(rank)``, as upstream).
    """

    def __init__(self, runtime_config: Any = None, rank: int | str = 0) -> None:
        self.rank = int(rank)
        options, _ = parse_runtime_config(datastates_config(runtime_config))
        self.engine = _Engine(
            host_cache_size=options.host_cache_size,
            parser_threads=options.parser_threads,
            pin_host_cache=options.pin_host_cache,
            copy_mode=options.copy_mode,
            rank=self.rank,
            handle_signals=False,
        )
        self._pending: dict[Path, InFlightCheckpoint] = {}
        self._renames: queue.Queue[tuple[InFlightCheckpoint, Path] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._failures: list[str] = []
        self._renamer = threading.Thread(target=self._rename_loop, name="ckptlib-dropin-rename", daemon=True)
        self._renamer.start()
        self._closed = False
        # Upstream registers its shutdown at exit too; a weak reference lets the object go.
        self_ref = weakref.ref(self)

        def shutdown_at_exit() -> None:
            obj = self_ref()
            if obj is not None:
                obj.shutdown()

        atexit.register(shutdown_at_exit)

    def save(self, state_dict: Mapping[str, Any], path: str | os.PathLike[str]) -> bool:
        """Starts writing ``state_dict`` to ``path``; returns True once its tensors are copied.

        Raises:
            TypeError: ``state_dict`` is not a dict (upstream's rule).
            CheckpointError: The engine is shut down.
        """
        if not isinstance(state_dict, (dict, OrderedDict)):
            raise TypeError(f"state_dict given to checkpoint must be a dictionary, got {type(state_dict).__name__}")
        target = Path(path).absolute()
        target.parent.mkdir(parents=True, exist_ok=True)
        job = self.engine.save_file(state_dict, target)  # its own temporary name, renamed when durable
        with self._lock:
            self._pending[target] = job
        self._renames.put((job, target))
        return True

    def load(self, path: str | os.PathLike[str], map_location: Any = None) -> Any:
        """Reads the dict saved at ``path``; waits first if ``path`` is still being written."""
        target = Path(path).absolute()
        with self._lock:
            pending = target in self._pending
        if pending:
            self.wait(persist=True)
        return torch.load(target, map_location=map_location, weights_only=False)

    def wait(self, persist: bool = False) -> None:
        """Without ``persist``: returns once every saved tensor is copied (upstream's meaning;
        here ``save`` already did). With it: once every file saved so far is durable at its path.

        Raises:
            CheckpointError: A file could not be written (named in the message).
        """
        if not persist:
            self.engine.wait(persist=False)
            return
        self.engine.wait(persist=True)
        self._renames.join()
        with self._lock:
            failures, self._failures = self._failures, []
        if failures:
            raise CheckpointError("; ".join(failures))

    def commit(self, tag: Any) -> bool:
        """Waits until every file saved so far is durable at its path; returns True."""
        self.wait(persist=True)
        logger.info("[DataStates.llm] Checkpoint %s is ready now!", tag)
        return True

    def shutdown(self) -> None:
        """Waits for the files in flight, then stops the engine's threads. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.wait(persist=True)
        finally:
            self._renames.put(None)
            self.engine.shutdown()

    def _rename_loop(self) -> None:
        while True:
            entry = self._renames.get()
            try:
                if entry is None:
                    return
                job, target = entry
                job.done.wait()
                error = job.error
                if error is not None:
                    logger.error("[DataStates.llm] Could not save %s: %s", target, error)
                    with self._lock:
                        self._failures.append(f"{target}: {error}")
                with self._lock:
                    if self._pending.get(target) is job:
                        del self._pending[target]
            finally:
                self._renames.task_done()
