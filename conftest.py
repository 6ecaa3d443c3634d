"""Repository-wide pytest set-up: the shared fixtures, registered once here as plugins (a test
module never imports a fixture by name: ``console/tests/test_architecture.py`` checks it).

* ``console.testing``: the users of every access test, projects, jobs, nodes and a node agent;
* ``console.tests.api_fixtures``: REST API clients;
* ``console.tests.page_fixtures``: signed-in page clients;
* ``console.tests.browser``: one live console server and one Chromium for every browser test;
* ``failover.tests.run_cleanup``: ``no_run_outlives_its_test`` for tests that start real runs;
* ``jobs.tests.slurm_fixtures``: a real Slurm cluster and the console on it (``BACKEND=slurm``).
"""

from __future__ import annotations

import pytest

pytest_plugins = [
    "console.testing",
    "console.tests.api_fixtures",
    "console.tests.page_fixtures",
    "console.tests.browser",
    "failover.tests.run_cleanup",
    "failover.tests.fake_gpus",
    "jobs.tests.slurm_fixtures",
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
