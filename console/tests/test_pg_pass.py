"""The PostgreSQL pass reruns the database tests and the API fuzz, not the process-level tests."""
from __future__ import annotations

from pathlib import Path

from console.tests.pg_pass import pytest_command


def test_the_postgresql_pass_reruns_the_api_fuzz_and_leaves_out_the_process_level_tests():
    command = pytest_command(["-q"])
    ignored = {Path(arg.split("=", 1)[1]).name for arg in command if arg.startswith("--ignore=")}
    assert "test_api_schema_fuzz.py" not in ignored
    assert {"ckptlib", "client", "bench", "test_browser_live.py", "test_scaleout_integration.py", "test_webhooks_end_to_end.py"} <= ignored
    assert command[command.index("pytest") + 1] == "-q"
