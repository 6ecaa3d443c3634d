"""A database that refuses a write once, as SQLite held by another writer past its busy timeout
or a PostgreSQL gone away does."""

from __future__ import annotations

from collections.abc import Callable

from django.db import OperationalError


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
