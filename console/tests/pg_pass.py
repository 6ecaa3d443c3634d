"""The PostgreSQL lane: ``python -m console.tests.pg_pass [pytest args]``.

Runs the apps' database tests again with ``DATABASE_URL`` pointing at ``TEST_POSTGRES_URL``
(default the local server's ``postgres`` database; pytest-django creates a test database per
worker beside it), on every core: the apps' tests marked ``database``, those whose outcome the
database decides (``harness.lanes``: migrations, query counts, committed transactions and locks,
filters, search and ordering, text it must store or refuse; and the slow ones that say so, e.g.
concurrent writers from real processes). The others check what the code does with rows any
database returns alike; they run on SQLite only. ckptlib, the client and the
benchmarks have no database. Where no PostgreSQL answers it says so and skips, unless
``REQUIRE_SCALEOUT=1`` (CI), where that is a failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness.scaleout import reachable

ROOT = Path(__file__).resolve().parents[2]
DATABASE_APPS = ("jobs", "logs", "agent", "failover", "notify", "console")
SELECTION = "database"


def pytest_command(argv: list[str]) -> list[str]:
    """The pytest command line of the PostgreSQL lane (``testpaths`` overridden: the apps only)."""
    return [sys.executable, "-m", "pytest", "-o", f"testpaths={' '.join(DATABASE_APPS)}", "-m", SELECTION, "-n", "auto", *argv]


def main(argv: list[str]) -> int:
    url = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    problem = reachable(url)
    if problem:
        print(f"\nPostgreSQL lane SKIPPED: no PostgreSQL at {url} ({problem}). Set TEST_POSTGRES_URL to run it.")
        return 1 if os.environ.get("REQUIRE_SCALEOUT") else 0
    print(f"\nPostgreSQL lane: the apps' database tests again on {url}", flush=True)
    env = {**os.environ, "DATABASE_URL": url}
    return subprocess.call(pytest_command(argv), env=env, cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
