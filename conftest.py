"""Repository-wide pytest set-up: the test harness's fixtures, registered once here as plugins (a
test module never imports a fixture by name: ``console/tests/test_architecture.py`` checks it).
``harness/`` is no product package; ``harness/__init__.py`` says what each module holds:

* ``harness.sandbox`` (first: it decides ``JOB_SANDBOX`` for the run) and ``harness.isolation``:
  container checks, what each test gets afresh and leaves behind;
* ``harness.lanes``: tests that start real processes are marked ``slow``;
* ``harness.accounts``, ``harness.job_factory``, ``harness.node_agent``: the users of every access
  test, projects, jobs, nodes and a node agent;
* ``harness.api`` and ``harness.pages``: REST API clients and signed-in page clients;
* ``harness.browser``: one live console server and one Chromium for every browser test;
* ``harness.scaleout``: the scale-out cluster on PostgreSQL and Redis;
* ``harness.slurm``: a real Slurm cluster and the console on it (``BACKEND=slurm``).

Fixtures one app's tests use alone live in that app's ``tests/conftest.py``.
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "harness.sandbox",
    "harness.isolation",
    "harness.lanes",
    "harness.accounts",
    "harness.job_factory",
    "harness.node_agent",
    "harness.api",
    "harness.pages",
    "harness.browser",
    "harness.scaleout",
    "harness.slurm",
]


@pytest.fixture(scope="session")
def django_db_modify_db_settings(django_db_modify_db_settings_parallel_suffix, tmp_path_factory) -> None:
    """The suite's SQLite database: a file of this test process's own (each xdist worker has its
    own base temp), opened with the deployment's options (WAL, ``BEGIN IMMEDIATE``, a busy
    timeout), not Django's default shared-cache in-memory database, whose table locks fail a
    concurrent writer at once ("database table is locked") as no deployment does (ARCHITECTURE.md,
    "One database file, many writers"). ``SQLITE_TEST_PATH`` still names a file of one's choice."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.sqlite3" and not database.get("TEST", {}).get("NAME"):
        database.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("database") / "console-test.sqlite3")
