"""One-off ``manage.py`` commands on a scale-out host use the deployment's database, never the
embedded SQLite by mistake.

Before Django starts, ``manage.py`` calls :func:`prepare`: where ``DATABASE_URL`` is not set, the
deployment's environment file (``CONSOLE_ENV_FILE``, default ``/etc/console/env``, the file the
systemd units read) is read when it exists, its values filling what the environment leaves unset;
and a command that would still run on the embedded SQLite while a scale-out setting
(``REDIS_URL``) is present is refused. No Django import here: it runs before settings load.
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

DEFAULT_ENV_FILE = "/etc/console/env"
SCALE_OUT_SETTINGS = ("REDIS_URL",)


def parse(text: str) -> dict[str, str]:
    """``KEY=value`` lines as systemd's EnvironmentFile reads them: blank lines and ``#`` comments
    skipped, one pair of surrounding quotes removed."""
    values = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key.isidentifier():
            continue
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key] = value
    return values


def prepare(environ: MutableMapping[str, str]) -> str | None:
    """Fill ``environ`` from the env file where it names no database; returns why the command must
    not run, or None."""
    if environ.get("DATABASE_URL"):
        return None
    path = environ.get("CONSOLE_ENV_FILE", DEFAULT_ENV_FILE)
    if path and os.path.exists(path):
        try:
            with open(path, encoding="utf-8") as f:
                values = parse(f.read())
        except OSError as exc:
            return (
                f"{path} (this host's scale-out environment) cannot be read: {exc.strerror}. Run the command as a "
                f"user who may read it, or set CONSOLE_ENV_FILE= (empty) to use the embedded database on purpose."
            )
        for key, value in values.items():
            environ.setdefault(key, value)
        if values.get("DATABASE_URL"):
            print(f"manage.py: the database and settings of {path}", file=sys.stderr)
    if environ.get("DATABASE_URL"):
        return None
    present = [name for name in SCALE_OUT_SETTINGS if environ.get(name)]
    if present:
        return (
            f"{', '.join(present)} is set (a scale-out setting) but DATABASE_URL is not: this command would run on "
            f"the embedded SQLite database. Set DATABASE_URL (or CONSOLE_ENV_FILE, the deployment's env file), "
            f"or unset {present[0]} for the embedded console."
        )
    return None


def prepare_or_exit() -> None:
    problem = prepare(os.environ)
    if problem:
        print(f"manage.py: refused: {problem}", file=sys.stderr)
        raise SystemExit(2)
