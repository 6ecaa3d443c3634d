"""Which tests ``make test-fast`` (``-m "not slow"``) leaves out: a test that asks for a fixture
starting real processes is marked ``slow``, whether or not its module says so."""

from __future__ import annotations

import pytest

# A test that asks for one of these starts real processes (a live console server, Chromium, a
# node agent whose runs are real processes): it is slow, whether or not its module says so.
REAL_PROCESS_FIXTURES = frozenset({"live_console", "browser", "page", "agent", "drive"})


def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``slow`` what ``make test-fast`` (``-m "not slow"``) leaves out: tests that start real
    processes (``REAL_PROCESS_FIXTURES``) and the scale-out cluster's (``scaleout``)."""
    for item in items:
        if "slow" in item.keywords:
            continue
        if REAL_PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("scaleout"):
            item.add_marker(pytest.mark.slow)
