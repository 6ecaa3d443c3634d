"""``datastates.ckpt``: upstream's checkpoint-engine module name, re-exporting the path-addressed
engine (``CheckpointEngine``, ``BaseCheckpointEngine``). Upstream's low-level C++ binding
(``CkptEngine.async_save`` of tensors at file offsets) has no counterpart here."""

from __future__ import annotations

import datastates  # noqa: F401  # puts ckptlib on the path when only the vendor dir is
from ckptlib._dropin import PathCheckpointing as CheckpointEngine

BaseCheckpointEngine = CheckpointEngine

__all__ = ["BaseCheckpointEngine", "CheckpointEngine"]
