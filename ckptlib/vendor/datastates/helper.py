"""``datastates.helper`` / ``datastates.llm.helper`` as upstream: the option names, their defaults,
``parse_config`` and ``get_checkpoint_version``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import datastates  # noqa: F401  # puts ckptlib on the path when only the vendor dir is
from ckptlib._dropin import datastates_config
from datastates.llm.deepspeed import get_ds_checkpoint_version, parse_ds_config

HOST_CACHE_SIZE = "host_cache_size"
HOST_CACHE_SIZE_DEFAULT = 0
CKPT_PARSER_THREADS = "parser_threads"
CKPT_PARSER_THREADS_DEFAULT = 4
FAST_CACHE_INIT = "fast_cache_init"
FAST_CACHE_INIT_DEFAULT = False
PIN_HOST_CACHE = "pin_host_cache"
PIN_HOST_CACHE_DEFAULT = True
SUPPORTED_CONFIG_CLASSES = ("dict", "OrderedDict", "DeepSpeedConfig")

__all__ = [
    "CKPT_PARSER_THREADS",
    "CKPT_PARSER_THREADS_DEFAULT",
    "FAST_CACHE_INIT",
    "FAST_CACHE_INIT_DEFAULT",
    "HOST_CACHE_SIZE",
    "HOST_CACHE_SIZE_DEFAULT",
    "PIN_HOST_CACHE",
    "PIN_HOST_CACHE_DEFAULT",
    "SUPPORTED_CONFIG_CLASSES",
    "get_checkpoint_version",
    "get_ds_checkpoint_version",
    "parse_config",
    "parse_ds_config",
]


def parse_config(config: Any) -> dict[str, Any]:
    """``host_cache_size`` and ``parser_threads`` of a dict or a DeepSpeed config, with upstream's
    defaults (a config of another type raises ``TypeError``; upstream raises ``Exception``)."""
    options = datastates_config(config) if config is not None else {}
    if not isinstance(options, Mapping):
        raise TypeError(f"config must be a dict or a DeepSpeed config, got {type(config).__name__}")
    result: dict[str, Any] = {HOST_CACHE_SIZE: HOST_CACHE_SIZE_DEFAULT, CKPT_PARSER_THREADS: CKPT_PARSER_THREADS_DEFAULT}
    for key in result:
        if key in options:
            result[key] = options[key]
    return result


def get_checkpoint_version(ckpt_path: str, last_version: int = -1) -> int:
    """The step of a DeepSpeed ``…/global_step<N>/…`` path, else ``last_version + 1``."""
    return get_ds_checkpoint_version(ckpt_path, last_version)
