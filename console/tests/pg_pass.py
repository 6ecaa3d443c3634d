"""The suite's second pass, on PostgreSQL: ``python -m console.tests.pg_pass [pytest args]``.

Runs every database test again with ``DATABASE_URL`` pointing at ``TEST_POSTGRES_URL`` (default
the local server's ``postgres`` database; pytest-django creates its own test database beside it).
Where no PostgreSQL answers it says so and skips, unless ``REQUIRE_SCALEOUT=1`` (CI), where that
is a failure. ckptlib (no database) and the process-level tests in console/tests (browser,
scale-out cluster: they set up their own databases) run in the first pass only.
"""
from __future__ import annotations

import os
import subprocess
import sys

from console.tests.scaleout import reachable


def main(argv: list[str]) -> int:
    url = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    problem = reachable(url)
    if problem:
        print(f"\nPostgreSQL pass SKIPPED: no PostgreSQL at {url} ({problem}). Set TEST_POSTGRES_URL to run it.")
        return 1 if os.environ.get("REQUIRE_SCALEOUT") else 0
    print(f"\nPostgreSQL pass: the suite again on {url}", flush=True)
    env = {**os.environ, "DATABASE_URL": url}
    command = [sys.executable, "-m", "pytest", *argv, "--ignore=ckptlib", "--ignore=console/tests"]
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
