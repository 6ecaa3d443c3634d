"""``from datastates.llm import Checkpointing, DecoratedCheckpointing``, backed by ckptlib.

``Checkpointing(runtime_config=…, rank=…)`` is upstream's path-addressed API
(``ckptlib._dropin.PathCheckpointing``); ``DecoratedCheckpointing`` is the service's Trainer
integration (``ckptlib._trainer``).
"""

from __future__ import annotations

import datastates  # noqa: F401  # puts ckptlib on the path when only the vendor dir is
from ckptlib import DecoratedCheckpointing
from ckptlib._dropin import PathCheckpointing as Checkpointing

CheckpointEngine = Checkpointing

__all__ = ["CheckpointEngine", "Checkpointing", "DecoratedCheckpointing"]
