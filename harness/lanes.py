"""Which tests ``make test-fast`` (``-m "not slow"``) leaves out, and which the PostgreSQL lane runs:
a test that asks for a fixture starting real processes is marked ``slow``, whether or not its
module says so; a fast test whose outcome the database decides is marked ``database``."""

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


# Fast test modules whose outcome the database itself decides, beyond what
# ``pytest_collection_modifyitems`` finds by itself (query counts, committed transactions): the
# PostgreSQL lane (``console/tests/pg_pass.py``, ``-m database``) runs them again there. Migrations
# (schema and data, on the database's own DDL); the queue's order and its index, filters, search
# (``icontains``, collation and where NULLs sort differ between SQLite and PostgreSQL); text the database must store or refuse (NUL
# characters, lone surrogates, lengths); bulk deletes and the order lines come back in.
DATABASE_MODULES = frozenset(
    {
        "jobs/tests/test_end_kind_migration.py",
        "jobs/tests/test_registry_password_migration.py",
        "failover/tests/test_evidence_migration.py",
        "jobs/tests/test_fair_share_queue.py",
        "jobs/tests/test_fair_share_index.py",
        "jobs/tests/test_queue_limits.py",
        "console/tests/test_api_list_filters.py",
        "console/tests/test_list_branches.py",
        "logs/tests/test_logs_api.py",
        "console/tests/test_api_unstorable_text.py",
        "console/tests/test_api_create_validation.py",
        "console/tests/test_untrusted_input.py",
        "console/tests/test_api_token_auth.py",
        "jobs/tests/test_job_fields.py",
        "logs/tests/test_log_retention.py",
        "logs/tests/test_log_download.py",
        "console/tests/test_running_time_across_attempts.py",
        "console/tests/test_pages_job_list_queries.py",
        "logs/tests/test_progress_ingest.py",
    }
)
# A fast test asking for one of these counts queries or commits transactions: ``database``.
DATABASE_FIXTURES = frozenset({"django_assert_num_queries", "django_assert_max_num_queries", "transactional_db", "django_db_reset_sequences"})


def is_database_specific(item) -> bool:
    """Whether a fast test's outcome depends on the database: its module is one of
    ``DATABASE_MODULES``, it counts queries, or it commits real transactions."""
    if item.nodeid.split("::", 1)[0] in DATABASE_MODULES or DATABASE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    marker = item.get_closest_marker("django_db")
    return bool(marker and (marker.kwargs.get("transaction") or marker.kwargs.get("reset_sequences")))


def pytest_ignore_collect(collection_path, config) -> bool | None:
    """``SLOW_ONLY_MODULES`` are not collected where the mark expression is ``not slow``."""
    if config.getoption("markexpr", "").strip() != "not slow":
        return None
    return True if collection_path.as_posix().endswith(tuple(f"/{module}" for module in SLOW_ONLY_MODULES)) else None


def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``slow`` what ``make test-fast`` (``-m "not slow"``) leaves out: tests that start real
    processes (``REAL_PROCESS_FIXTURES``) and the scale-out cluster's (``scaleout``). Mark
    ``database`` the other tests whose outcome the database decides (``is_database_specific``);
    a slow test is ``database`` only where it says so (it runs real processes on PostgreSQL too)."""
    for item in items:
        if "slow" in item.keywords:
            continue
        if REAL_PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("scaleout"):
            item.add_marker(pytest.mark.slow)
        elif "database" not in item.keywords and is_database_specific(item):
            item.add_marker(pytest.mark.database)
