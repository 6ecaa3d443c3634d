"""The suite's second pass, on PostgreSQL: ``python -m console.tests.pg_pass [pytest args]``.

Runs every database test again with ``DATABASE_URL`` pointing at ``TEST_POSTGRES_URL`` (default
the local server's ``postgres`` database; pytest-django creates its own test database beside it).
Where no PostgreSQL answers it says so and skips, unless ``REQUIRE_SCALEOUT=1`` (CI), where that
is a failure. ckptlib, the client and the benchmarks' tests (no database), the tests in
console/tests and the process-level ones of other apps (``PROCESS_LEVEL``: browser, live console
and scale-out cluster tests set up their own databases) run in the first pass only, except those
named in ``ON_POSTGRES_TOO``: the schemathesis fuzz of every API endpoint runs on both.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.scaleout import reachable

CONSOLE_TESTS = Path(__file__).resolve().parent
ROOT = CONSOLE_TESTS.parent.parent
ON_POSTGRES_TOO = ("test_api_schema_fuzz.py",)
# Left out (no database): ckptlib, client, bench.
PROCESS_LEVEL = (
    "notify/tests/test_webhooks_end_to_end.py",
    "jobs/tests/test_live_across_processes.py",
    "jobs/tests/test_scaleout_live_status.py",
    "logs/tests/test_log_flood_browser.py",
)


DATABASE_APPS = ("jobs", "logs", "agent", "failover", "notify", "console")


def pytest_command(argv: list[str]) -> list[str]:
    """The pytest command line of the PostgreSQL pass: the apps' tests (``testpaths`` overridden:
    an ``--ignore`` does not apply to a directory pytest starts from), less the first-pass-only
    files."""
    first_pass_only = [path for path in sorted(CONSOLE_TESTS.glob("test_*.py")) if path.name not in ON_POSTGRES_TOO]
    first_pass_only += [ROOT / path for path in PROCESS_LEVEL]
    return [
        sys.executable, "-m", "pytest", "-o", f"testpaths={' '.join(DATABASE_APPS)}", *argv,
        *(f"--ignore={path}" for path in first_pass_only),
    ]  # fmt: skip


def main(argv: list[str]) -> int:
    url = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    problem = reachable(url)
    if problem:
        print(f"\nPostgreSQL pass SKIPPED: no PostgreSQL at {url} ({problem}). Set TEST_POSTGRES_URL to run it.")
        return 1 if os.environ.get("REQUIRE_SCALEOUT") else 0
    print(f"\nPostgreSQL pass: the suite again on {url}", flush=True)
    env = {**os.environ, "DATABASE_URL": url}
    return subprocess.call(pytest_command(argv), env=env)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
