"""``datastates.deepspeed`` (upstream's newer layout): see ``datastates.llm.deepspeed``."""

from __future__ import annotations

from datastates.llm.deepspeed import get_ds_checkpoint_version, parse_ds_config

__all__ = ["get_ds_checkpoint_version", "parse_ds_config"]
