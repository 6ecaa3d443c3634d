"""runtime_config: unknown keys warn, bad values raise an error naming the key."""

from __future__ import annotations

import pytest

from ckptlib import RuntimeConfig, parse_runtime_config


def test_the_documented_config_is_accepted() -> None:
    options, trainer = parse_runtime_config({"host_cache_size": 50, "parser_threads": 1, "pin_host_cache": True, "trainer": None})
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
        ("copy_mode", "copy"),
        ("copy_mode", ["eager"]),
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


@pytest.mark.parametrize("mode", ["checked", "eager", "lazy"])
@pytest.mark.slow  # a Python process of its own
def test_the_copy_mode_is_a_runtime_config_key_and_reaches_the_engine(mode: str) -> None:
    """``copy_mode`` chosen in runtime_config: the drop-in's and the Trainer's engines copy as
    asked (it was warned about as unknown and ignored before)."""
    import subprocess
    import sys
    import warnings
    from pathlib import Path

    import ckptlib
    from ckptlib._dropin import PathCheckpointing

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        options, _ = parse_runtime_config({"copy_mode": mode})
    assert options.copy_mode == mode
    assert parse_runtime_config({})[0].copy_mode == "checked"
    path_api = PathCheckpointing({"copy_mode": mode, "parser_threads": 1})
    try:
        assert path_api.engine.copy_mode == mode
    finally:
        path_api.shutdown()
    # DecoratedCheckpointing installs the process's SIGTERM handler: asked in a process of its own.
    script = (
        "from ckptlib._trainer import DecoratedCheckpointing\n"
        f"d = DecoratedCheckpointing(runtime_config={{'copy_mode': {mode!r}, 'parser_threads': 1}})\n"
        "print(d.engine.copy_mode)\nd.shutdown()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(ckptlib.__file__).parents[1], check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == [mode], done.stderr[-2000:]


@pytest.mark.slow  # a Python process of its own
def test_importing_ckptlib_and_reading_a_config_loads_no_torch() -> None:
    """The console reads ckptlib's commit lines (``logs.progress_parser``) without torch: a
    config's copy modes live where no torch is imported."""
    import subprocess
    import sys
    from pathlib import Path

    import ckptlib

    script = "import sys, ckptlib; ckptlib.parse_runtime_config({'copy_mode': 'eager'}); print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(ckptlib.__file__).parents[1], check=False)  # fmt: skip
    assert done.returncode == 0 and done.stdout.split() == ["False"], done.stderr[-2000:]
