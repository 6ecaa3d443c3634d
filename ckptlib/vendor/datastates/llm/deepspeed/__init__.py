"""``datastates.llm.deepspeed`` as upstream: reading DataStates' options from a DeepSpeed config."""

from __future__ import annotations

import re
from typing import Any

import datastates  # noqa: F401  # puts ckptlib on the path when only the vendor dir is
from ckptlib._dropin import datastates_config

__all__ = ["get_ds_checkpoint_version", "parse_ds_config"]


def parse_ds_config(config: Any) -> dict[str, Any]:
    """The ``datastates_ckpt`` options of a DeepSpeed config object (upstream raises
    AssertionError when it is missing or disabled; this raises ValueError)."""
    if config is None:
        raise ValueError("DeepSpeed config cannot be None")
    return datastates_config(config)


def get_ds_checkpoint_version(ckpt_path: str, last_version: int = -1) -> int:
    """The step of a ``…/global_step<N>/file`` path, else ``last_version + 1`` (as upstream)."""
    match = re.search(r"/global_step(\d+)/", str(ckpt_path))
    return int(match.group(1)) if match else last_version + 1
