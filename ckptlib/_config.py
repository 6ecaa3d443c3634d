"""The ``runtime_config`` mapping of ``DecoratedCheckpointing``, validated."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_DEFAULT_GRACE_PERIOD_S = 30.0
# CheckpointEngine's copy modes (``ckptlib._guard``); here so that reading a config needs no torch.
COPY_MODES = ("checked", "eager", "lazy")


@dataclass(frozen=True)
class RuntimeConfig:
    """Engine options.

    Attributes:
        host_cache_size: Upper bound of the host staging cache, in GB as DataStates counts them
            (``size * 2**30`` bytes, upstream's ``int(size * (1 << 30))``). A bound, not an
            allocation: the cache grows only to what staged state needs. ``0`` (upstream's
            default) means "size it for me": 80 % of ``MemAvailable`` when the engine starts
            (the cap the cache applies to any bound), or 50 GB where that cannot be read.
        parser_threads: Background threads writing staged bytes to disk (upstream's default, 4).
        pin_host_cache: Pin the cache (page-locked) when CUDA is present.
        grace_period_s: Seconds a final checkpoint on SIGTERM or exit may take to persist.
        copy_mode: ``"checked"`` (default), ``"eager"`` or ``"lazy"``: ``CheckpointEngine``'s
            ``copy_mode`` (``ckptlib._guard``).
    """

    host_cache_size: float = 0.0
    parser_threads: int = 4
    pin_host_cache: bool = True
    grace_period_s: float = _DEFAULT_GRACE_PERIOD_S
    copy_mode: str = "checked"

    @property
    def host_cache_bytes(self) -> int:
        if self.host_cache_size == 0:
            return auto_host_cache_bytes()
        return int(self.host_cache_size * GB)


# Upstream DataStates converts ``host_cache_size`` with ``1 << 30``.
GB = 1 << 30
# Where MemAvailable cannot be read, "size it for me" falls back to this bound.
_AUTO_FALLBACK_BYTES = 50 * GB
# Share of MemAvailable the automatic bound takes (the cap HostCache applies to any bound).
AUTO_SHARE = 0.8


def auto_host_cache_bytes() -> int:
    """The bound ``host_cache_size: 0`` stands for: 80 % of ``MemAvailable`` now, else 50 GB."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(int(line.split()[1]) * 1024 * AUTO_SHARE)
    except (OSError, ValueError, IndexError):
        pass
    return _AUTO_FALLBACK_BYTES


# ``fast_cache_init`` is one of upstream's keys (no effect here: the cache is never memset).
_KNOWN_KEYS = {"host_cache_size", "parser_threads", "pin_host_cache", "fast_cache_init", "grace_period_s", "copy_mode", "trainer"}


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
        host_cache_size=_non_negative_number(config, "host_cache_size", defaults.host_cache_size),
        parser_threads=_positive_int(config, "parser_threads", defaults.parser_threads),
        pin_host_cache=_boolean(config, "pin_host_cache", defaults.pin_host_cache),
        grace_period_s=_positive_number(config, "grace_period_s", defaults.grace_period_s),
        copy_mode=_copy_mode(config, defaults.copy_mode),
    )
    if "fast_cache_init" in config:
        _boolean(config, "fast_cache_init", False)
    return options, config.get("trainer")


def check_copy_mode(mode: Any, where: str = "copy_mode") -> str:
    """``mode`` if it is one of ``COPY_MODES``; else a ValueError naming ``where``."""
    if mode not in COPY_MODES:
        raise ValueError(f"{where} must be one of {', '.join(map(repr, COPY_MODES))}, got {mode!r}")
    return str(mode)


def _copy_mode(config: Mapping[str, Any], default: str) -> str:
    return check_copy_mode(config.get("copy_mode", default), "runtime_config['copy_mode']")


def _positive_number(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"runtime_config[{key!r}] must be a positive number, got {value!r}")
    return float(value)


def _non_negative_number(config: Mapping[str, Any], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"runtime_config[{key!r}] must be a number >= 0, got {value!r}")
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
