"""A database that refuses a write once, as SQLite held by another writer past its busy timeout
or a PostgreSQL gone away does; the test database moved back along its migrations and forward
again; each test process's SQLite file copied from a migrated template (``from_template``)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import django
from django.apps import apps
from django.apps.registry import Apps
from django.conf import settings
from django.db import OperationalError, connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.loader import MigrationLoader
from django.test.utils import setup_databases

TEMPLATES = Path(__file__).resolve().parent.parent / "var" / "test-databases"


def refuse_once(monkeypatch, owner, name: str, when: Callable[..., bool] = lambda *args, **kwargs: True) -> list:
    """Make ``owner.name`` fail once, where ``when(*args)`` says, as the database does when it
    cannot serve a write (SQLite held by another writer past the busy timeout, PostgreSQL gone);
    returns the refused calls' first arguments."""

    real = getattr(owner, name)
    refused: list = []

    def refusing(*args, **kwargs):
        if not refused and when(*args, **kwargs):
            refused.append(args[0] if args else None)
            raise OperationalError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, refusing)
    return refused


class Migrations:
    """The test database moved along its migrations (``migrated_back``)."""

    def migrate(self, targets: list[tuple[str, str]]) -> Apps:
        """Move to ``targets``; returns the models as they are there."""
        executor = MigrationExecutor(connection)  # a fresh graph: the last move changed what is applied
        executor.migrate(targets)
        return executor.loader.project_state(targets).apps


@contextmanager
def migrated_back(before: list[tuple[str, str]]) -> Iterator[tuple[Migrations, Apps]]:
    """The database migrated back to ``before`` for the block (with the models as they were
    there), then forward to every app's latest migration again, whatever the block did."""
    latest = MigrationExecutor(connection).loader.graph.leaf_nodes()
    migrations = Migrations()
    try:
        yield migrations, migrations.migrate(before)
    finally:
        migrations.migrate(latest)


def migrations_key() -> str:
    """What a migrated database depends on: Django's and SQLite's versions and every installed
    app's migration files, byte for byte (a changed or added migration is a new template)."""
    digest = hashlib.sha256(f"{django.get_version()} {sqlite3.sqlite_version}".encode())
    for config in sorted(apps.get_app_configs(), key=lambda config: config.label):
        module, _ = MigrationLoader.migrations_module(config.label)
        spec = importlib.util.find_spec(module) if module else None
        for directory in (spec.submodule_search_locations or []) if spec else []:
            for path in sorted(Path(directory).glob("*.py")):
                digest.update(f"{config.label}/{path.name}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def from_template(*, serialize: bool, verbosity: int) -> list:
    """The test process's SQLite file (its ``TEST["NAME"]``) as ``create_test_db`` leaves it, but
    copied from ``var/test-databases/<migrations_key>.sqlite3`` (made by the first process that
    finds none: migrated as Django migrates a test database, then copied with SQLite's backup)
    instead of migrated again. Returns ``setup_databases``' configuration for its teardown."""
    template = TEMPLATES / f"{migrations_key()}.sqlite3"
    if not template.exists():
        config = setup_databases(verbosity=verbosity, interactive=False, aliases={"default"}, serialized_aliases={"default"} if serialize else set())
        TEMPLATES.mkdir(parents=True, exist_ok=True)
        partial = template.with_name(f".{template.name}.{os.getpid()}")
        with closing(sqlite3.connect(connection.settings_dict["NAME"])) as source, closing(sqlite3.connect(partial)) as target:
            source.backup(target)
        os.replace(partial, template)  # whole or absent: a process beside this one may be copying it
        return config
    old_name = connection.settings_dict["NAME"]
    test_name = connection.creation._get_test_db_name()
    connection.close()
    shutil.copyfile(template, test_name)
    settings.DATABASES[connection.alias]["NAME"] = test_name
    connection.settings_dict["NAME"] = test_name
    connection.ensure_connection()
    if serialize:
        connection._test_serialized_contents = connection.creation.serialize_db_to_string()
    return [(connection, old_name, True)]
