"""``from datastates.llm import DecoratedCheckpointing``, re-exported from ckptlib."""

from __future__ import annotations

import datastates  # noqa: F401  # puts ckptlib on the path when only the vendor dir is
from ckptlib import CheckpointEngine, DecoratedCheckpointing

Checkpointing = CheckpointEngine

__all__ = ["CheckpointEngine", "Checkpointing", "DecoratedCheckpointing"]
