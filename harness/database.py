"""A database that refuses a write once, as SQLite held by another writer past its busy timeout
or a PostgreSQL gone away does; the test database moved back along its migrations and forward again."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.apps.registry import Apps
from django.db import OperationalError, connection
from django.db.migrations.executor import MigrationExecutor


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
