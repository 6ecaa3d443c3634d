"""``datastates.llm.checkpointing`` as upstream names it: the path-addressed ``Checkpointing``."""

from __future__ import annotations

from typing import NoReturn

import datastates  # noqa: F401  # puts ckptlib on the path when only the vendor dir is
from ckptlib._dropin import PathCheckpointing as Checkpointing
from datastates._missing import missing

CheckpointEngine = Checkpointing

__all__ = ["CheckpointEngine", "Checkpointing"]


def __getattr__(name: str) -> NoReturn:
    missing(__name__, name)
