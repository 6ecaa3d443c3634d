"""ckptlib: an asynchronous checkpoint engine, a drop-in for ``datastates.llm``.

Plain PyTorch::

    engine = ckptlib.CheckpointEngine(output_dir="out", host_cache_size=4)
    engine.save({"model": model, "optimizer": optimizer}, step=step)
    ...
    engine.load(into={"model": model, "optimizer": optimizer})

Hugging Face Trainer (the service's documentation)::

    from datastates.llm import DecoratedCheckpointing
    DecoratedCheckpointing(runtime_config={"host_cache_size": 50, "trainer": trainer}, rank=args.local_rank)
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptlib._config import RuntimeConfig, parse_runtime_config
from ckptlib._events import COMMIT_LINE_RE, CommitEvent, parse_commit_line
from ckptlib._layout import CHECKPOINT_SUBDIR, checkpoint_root, committed_steps, read_latest
from ckptlib._signals import safe_point
from ckptlib._types import CheckpointError, CheckpointResult, LoadedCheckpoint

if TYPE_CHECKING:
    from ckptlib._engine import CheckpointEngine
    from ckptlib._trainer import DecoratedCheckpointing

# The engine needs torch; the layout, the result types and the log-line parser do not. Importing
# the package stays light (the console reads checkpoint steps and commit lines without torch); the
# engine's names load on first use.
_LAZY = {
    "CheckpointEngine": "ckptlib._engine",
    "DecoratedCheckpointing": "ckptlib._trainer",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ckptlib' has no attribute {name!r}")


__all__ = [
    "CHECKPOINT_SUBDIR",
    "COMMIT_LINE_RE",
    "CheckpointEngine",
    "CheckpointError",
    "CheckpointResult",
    "CommitEvent",
    "DecoratedCheckpointing",
    "LoadedCheckpoint",
    "RuntimeConfig",
    "checkpoint_root",
    "committed_steps",
    "parse_commit_line",
    "parse_runtime_config",
    "read_latest",
    "safe_point",
    "vendor_path",
]


def vendor_path() -> str:
    """The directory to put on ``PYTHONPATH`` (``$CHECKPOINT_VENDOR``) for ``import datastates.llm``."""
    return str(Path(__file__).resolve().parent / "vendor")
