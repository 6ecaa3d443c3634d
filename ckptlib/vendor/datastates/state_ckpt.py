"""``datastates.state_ckpt`` (upstream's newer layout): the path-addressed ``CheckpointEngine``;
upstream's C++-backed engines and ``CkptEngine`` raise ``ImportError``."""

from __future__ import annotations

from typing import NoReturn

from datastates._missing import missing
from datastates.ckpt import BaseCheckpointEngine, CheckpointEngine

__all__ = ["BaseCheckpointEngine", "CheckpointEngine"]


def __getattr__(name: str) -> NoReturn:
    missing(__name__, name)
