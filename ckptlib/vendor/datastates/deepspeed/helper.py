"""``datastates.deepspeed.helper`` as upstream: ``parse_ds_config``, ``get_ds_checkpoint_version``."""

from __future__ import annotations

from datastates.llm.deepspeed import get_ds_checkpoint_version, parse_ds_config

__all__ = ["get_ds_checkpoint_version", "parse_ds_config"]
