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
def django_db_modify_db_settings(request, django_db_modify_db_settings_parallel_suffix, tmp_path_factory) -> None:
    """The suite's SQLite database: a file of this test process's own (each xdist worker has its
    own base temp), opened with the deployment's options (WAL, ``BEGIN IMMEDIATE``, a busy
    timeout), not Django's default shared-cache in-memory database, whose table locks fail a
    concurrent writer at once ("database table is locked") as no deployment does (ARCHITECTURE.md,
    "One database file, many writers"). ``SQLITE_TEST_PATH`` still names a file of one's choice."""
    from django.conf import settings

    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.sqlite3" and not database.get("TEST", {}).get("NAME"):
        database.setdefault("TEST", {})["NAME"] = str(tmp_path_factory.mktemp("database") / "console-test.sqlite3")
        request.config.stash[_TEMPLATE_READY] = True


_TEMPLATE_READY = pytest.StashKey[bool]()


@pytest.fixture(scope="session")
def django_db_setup(
    request, django_test_environment, django_db_blocker, django_db_use_migrations, django_db_keepdb, django_db_createdb, django_db_modify_db_settings
):
    """pytest-django's set-up of the test databases, but where the suite's own SQLite file is made
    (above) it starts as a copy of a migrated template (``harness.database.from_template``,
    one per migration set, in ``var/``) instead of migrating afresh: 3 s less for each test
    process (each xdist worker, each lane, each single test run)."""
    from django.test.utils import setup_databases, teardown_databases
    from pytest_django.fixtures import _disable_migrations, _get_databases_for_setup

    from harness.database import from_template

    aliases, serialized_aliases = _get_databases_for_setup(request.session.items)
    with django_db_blocker.unblock():
        if request.config.stash.get(_TEMPLATE_READY, False) and django_db_use_migrations and not django_db_keepdb and aliases <= {"default"}:
            db_cfg = from_template(serialize="default" in serialized_aliases, verbosity=request.config.option.verbose)
        else:
            if not django_db_use_migrations:
                _disable_migrations()
            keep = {"keepdb": True} if django_db_keepdb and not django_db_createdb else {}
            db_cfg = setup_databases(verbosity=request.config.option.verbose, interactive=False, aliases=aliases, serialized_aliases=serialized_aliases, **keep)
    yield
    if not django_db_keepdb:
        with django_db_blocker.unblock():
            try:
                teardown_databases(db_cfg, verbosity=request.config.option.verbose)
            except Exception as exc:  # as pytest-django: a database still in use is left, with a warning
                request.node.warn(pytest.PytestWarning(f"Error when trying to teardown test databases: {exc!r}"))
