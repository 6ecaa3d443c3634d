"""The PostgreSQL pass reruns the database tests and the API fuzz, not the process-level tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from console.tests.pg_pass import ROOT, pytest_command


def test_the_postgresql_pass_reruns_the_api_fuzz_and_leaves_out_the_process_level_tests():
    command = pytest_command(["-q"])
    ignored = {Path(arg.split("=", 1)[1]).name for arg in command if arg.startswith("--ignore=")}
    assert "test_api_schema_fuzz.py" not in ignored
    assert {"test_browser_live.py", "test_scaleout_integration.py", "test_webhooks_end_to_end.py"} <= ignored
    assert "-q" in command


@pytest.mark.slow  # a pytest process
def test_the_postgresql_pass_collects_no_test_of_ckptlib_the_client_or_the_benchmarks():
    """What it would run, as pytest collects it (an --ignore of a testpaths directory is not
    honoured: the pass names the apps it runs instead)."""
    listed = subprocess.run([*pytest_command(["-q"]), "--collect-only", "-p", "no:cacheprovider"], check=False, capture_output=True, text=True, cwd=ROOT)
    collected = {line.split("/", 1)[0] for line in listed.stdout.splitlines() if "::" in line}
    assert collected == {"jobs", "logs", "agent", "failover", "notify", "console"}, listed.stdout[-2000:]
