"""``datastates.engines`` (upstream's newer layout): ``CheckpointEngine(runtime_config, rank)`` and
``parse_config``; upstream's engine classes over its C++ engine (``SimpleCheckpointEngine``,
``StateCheckpointEngine``, ``StateCheckpointEngineAggregated``, ``ENGINE_REGISTRY``) raise
``ImportError``."""

from __future__ import annotations

from typing import NoReturn

from datastates._missing import missing
from datastates.ckpt import CheckpointEngine
from datastates.helper import parse_config

__all__ = ["CheckpointEngine", "parse_config"]


def __getattr__(name: str) -> NoReturn:
    missing(__name__, name)
