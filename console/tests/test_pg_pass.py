"""The PostgreSQL lane reruns the apps' database tests (``-m database``): the fast tests whose outcome
the database decides (``harness.lanes``) and the slow ones marked ``database``; no other."""

from __future__ import annotations

import subprocess

import pytest

from console.tests.pg_pass import ROOT, pytest_command


def collected(*extra: str) -> set[str]:
    listed = subprocess.run(
        [*pytest_command(["-q", *extra]), "--collect-only", "-p", "no:cacheprovider", "-n", "0"], check=False, capture_output=True, text=True, cwd=ROOT
    )
    assert listed.returncode == 0, listed.stdout[-2000:] + listed.stderr[-2000:]
    return {line for line in listed.stdout.splitlines() if "::" in line}


@pytest.mark.slow  # pytest processes
def test_the_postgresql_lane_runs_the_tests_the_database_decides_and_no_process_level_one():
    tests = collected()
    # The apps' alone (the agent's database tests all start real runs: not here).
    assert {test.split("/", 1)[0] for test in tests} == {"jobs", "logs", "failover", "notify", "console"}
    # The queue's order, a migration, query counts, committed transactions, a filter, slow ones
    # marked database; no test the database does not decide, no browser or cluster test.
    assert "jobs/tests/test_fair_share_queue.py::test_two_hundred_jobs_no_node_can_hold_do_not_block_a_placeable_one" in tests
    for module in (
        "jobs/tests/test_end_kind_migration.py",
        "console/tests/test_pages_job_list_queries.py",
        "logs/tests/test_log_socket.py",
        "console/tests/test_api_list_filters.py",
    ):
        assert any(test.startswith(f"{module}::") for test in tests), module
    assert not [test for test in tests if test.startswith(("logs/tests/test_terminal_text.py::", "failover/tests/test_classify_corpus.py::"))]
    for module in ("console/tests/test_writers_queue_for_the_database.py", "logs/tests/test_log_ingest_race.py"):
        assert any(test.startswith(f"{module}::") for test in tests), module
    assert "jobs/tests/test_bulk_placement.py::test_on_postgresql_two_placements_at_once_place_each_job_once" in tests
    assert not [test for test in tests if "test_browser_" in test or "test_scaleout_" in test]
