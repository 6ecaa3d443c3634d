"""Which tests ``make test-fast`` (``-m "not slow"``) leaves out: a test that asks for a fixture
starting real processes is marked ``slow``, whether or not its module says so."""

from __future__ import annotations

import pytest

# A test that asks for one of these starts real processes (a live console server, Chromium, a
# node agent whose runs are real processes): it is slow, whether or not its module says so.
REAL_PROCESS_FIXTURES = frozenset({"live_console", "browser", "page", "agent", "drive"})

# Modules whose every test is ``slow`` and whose import alone costs seconds: the fast lane
# (``-m "not slow"``) does not import them at all. The API fuzz module builds the API's OpenAPI
# schema through the WSGI app at import (schemathesis parametrizes from it): 5 s of every xdist
# worker's collection. ``console/tests/test_fast_lane_is_hermetic.py`` checks every test of each
# is slow.
SLOW_ONLY_MODULES = frozenset({"console/tests/test_api_schema_fuzz.py"})


def pytest_ignore_collect(collection_path, config) -> bool | None:
    """``SLOW_ONLY_MODULES`` are not collected where the mark expression is ``not slow``."""
    if config.getoption("markexpr", "").strip() != "not slow":
        return None
    return True if collection_path.as_posix().endswith(tuple(f"/{module}" for module in SLOW_ONLY_MODULES)) else None


def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``slow`` what ``make test-fast`` (``-m "not slow"``) leaves out: tests that start real
    processes (``REAL_PROCESS_FIXTURES``) and the scale-out cluster's (``scaleout``)."""
    for item in items:
        if "slow" in item.keywords:
            continue
        if REAL_PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("scaleout"):
            item.add_marker(pytest.mark.slow)
