"""The PostgreSQL lane reruns the apps' database tests: every test not marked slow, and the slow
ones marked ``database``."""

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
def test_the_postgresql_lane_runs_the_apps_database_tests_and_no_process_level_one():
    tests = collected()
    assert {test.split("/", 1)[0] for test in tests} == {"jobs", "logs", "agent", "failover", "notify", "console"}
    # A database test of the apps, a slow one marked database, and no browser or cluster test.
    assert "jobs/tests/test_fair_share_queue.py::test_two_hundred_jobs_no_node_can_hold_do_not_block_a_placeable_one" in tests
    for module in ("console/tests/test_writers_queue_for_the_database.py", "logs/tests/test_log_ingest_race.py"):
        assert any(test.startswith(f"{module}::") for test in tests), module
    assert "jobs/tests/test_bulk_placement.py::test_on_postgresql_two_placements_at_once_place_each_job_once" in tests
    assert not [test for test in tests if "test_browser_" in test or "test_scaleout_" in test]
