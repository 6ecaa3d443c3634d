"""The ``runtime_config`` mapping of ``DecoratedCheckpointing``, validated."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_DEFAULT_GRACE_PERIOD_S = 30.0


@dataclass(frozen=True)
class RuntimeConfig:
    """Engine options.

    Attributes:
        host_cache_size: Upper bound of the host staging cache, in GB (10**9 bytes). A bound,
            not an allocation: the cache grows only to what staged state needs.
        parser_threads: Background threads writing staged bytes to disk.
        pin_host_cache: Pin the cache (page-locked) when CUDA is present.
        grace_period_s: Seconds a final checkpoint on SIGTERM or exit may take to persist.
    """

    host_cache_size: float = 50.0
    parser_threads: int = 1
    pin_host_cache: bool = True
    grace_period_s: float = _DEFAULT_GRACE_PERIOD_S

    @property
    def host_cache_bytes(self) -> int:
        return int(self.host_cache_size * 1e9)


_KNOWN_KEYS = {"host_cache_size", "parser_threads", "pin_host_cache", "grace_period_s", "trainer"}


def parse_runtime_config(config: Mapping[str, Any]) -> tuple[RuntimeConfig, Any]:
    """Validates a ``runtime_config`` mapping.

    Args:
        config: The mapping of the service's documentation; ``trainer`` is optional.

    Returns:
        The options and the trainer (None when absent).

    Raises:
        TypeError: ``config`` is not a mapping.
        ValueError: A value is out of range or of the wrong type; the message names the key.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"runtime_config must be a dict, got {type(config).__name__}")
    for key in config:
        if key not in _KNOWN_KEYS:
            warnings.warn(f"ckptlib: unknown runtime_config key {key!r} is ignored", stacklevel=3)
            logger.warning("[Concurrent Checkpoint] unknown runtime_config key %r is ignored", key)
    defaults = RuntimeConfig()
    options = RuntimeConfig(
        host_cache_size=_positive_number(config, "host_cache_size", defaults.host_cache_size),
        parser_threads=_positive_int(config, "parser_threads", defaults.parser_threads),
        pin_host_cache=_boolean(config, "pin_host_cache", defaults.pin_host_cache),
        grace_period_s=_positive_number(config, "grace_period_s", defaults.grace_period_s),
    )
    return options, config.get("trainer")


def _positive_number(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"runtime_config[{key!r}] must be a positive number, got {value!r}")
    return float(value)


def _positive_int(config: Mapping[str, Any], key: str, default: int) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"runtime_config[{key!r}] must be an integer >= 1, got {value!r}")
    return value


def _boolean(config: Mapping[str, Any], key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise ValueError(f"runtime_config[{key!r}] must be true or false, got {value!r}")
    return value
