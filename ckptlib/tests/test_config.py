"""runtime_config: unknown keys warn, bad values raise an error naming the key."""

from __future__ import annotations

import pytest

from ckptlib import RuntimeConfig, parse_runtime_config


def test_the_documented_config_is_accepted() -> None:
    options, trainer = parse_runtime_config(
        {"host_cache_size": 50, "parser_threads": 1, "pin_host_cache": True, "trainer": None}
    )
    assert options == RuntimeConfig(host_cache_size=50.0, parser_threads=1, pin_host_cache=True)
    assert trainer is None


def test_an_unknown_key_warns() -> None:
    with pytest.warns(UserWarning, match="host_cache_sise"):
        parse_runtime_config({"host_cache_sise": 50})


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("host_cache_size", -1),
        ("host_cache_size", "50"),
        ("parser_threads", 0),
        ("parser_threads", 1.5),
        ("pin_host_cache", "yes"),
        ("grace_period_s", -1),
    ],
)
def test_a_bad_value_raises_naming_the_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=key):
        parse_runtime_config({key: value})


def test_upstream_defaults_units_and_keys() -> None:
    options, _ = parse_runtime_config({"fast_cache_init": True})
    assert options.parser_threads == 4  # upstream's CKPT_PARSER_THREADS_DEFAULT
    assert options.host_cache_size == 0  # "size it for me"
    assert options.host_cache_bytes > 0
    assert RuntimeConfig(host_cache_size=1).host_cache_bytes == 1 << 30  # upstream: GB * (1 << 30)
