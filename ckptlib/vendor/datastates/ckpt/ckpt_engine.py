"""``datastates.ckpt.ckpt_engine`` as upstream names it: the path-addressed engine. Upstream's C++
``CkptEngine`` is not implemented (importing it raises ``ImportError``)."""

from __future__ import annotations

from typing import NoReturn

from datastates._missing import missing
from datastates.ckpt import BaseCheckpointEngine, CheckpointEngine

__all__ = ["BaseCheckpointEngine", "CheckpointEngine"]


def __getattr__(name: str) -> NoReturn:
    missing(__name__, name)
