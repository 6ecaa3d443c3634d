"""One-off manage.py commands on a scale-out host: the deployment's env file is read, and a command
that would run on the embedded SQLite beside a scale-out setting is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from console import envfile

ROOT = Path(__file__).resolve().parents[2]
SCALE_OUT = {"DATABASE_URL", "REDIS_URL", "CONSOLE_ENV_FILE", "DJANGO_SETTINGS_MODULE"}


def manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in SCALE_OUT}
    return subprocess.run([sys.executable, "manage.py", *args], check=False, cwd=ROOT, env={**base, **env}, capture_output=True, text=True, timeout=120)


ENGINE = ("shell", "--no-imports", "-c", "from django.conf import settings; print(settings.DATABASES['default']['ENGINE'])")


def test_the_env_file_is_parsed_as_systemd_reads_it():
    text = '# comment\n\nSECRET_KEY=abc=def\nQUOTED="a b"\n not a pair\nALLOWED_HOSTS=x,y\n'
    assert envfile.parse(text) == {"SECRET_KEY": "abc=def", "QUOTED": "a b", "ALLOWED_HOSTS": "x,y"}


@pytest.mark.slow  # manage.py processes
def test_a_command_beside_a_scale_out_setting_without_a_database_is_refused(tmp_path):
    done = manage(
        "inject_fault",
        "node-a",
        "--gpu",
        "3",
        REDIS_URL="redis://127.0.0.1:6379/15",
        CONSOLE_ENV_FILE=str(tmp_path / "none"),
        CONSOLE_VAR_DIR=str(tmp_path / "var"),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "REDIS_URL is set (a scale-out setting) but DATABASE_URL is not" in done.stderr
    assert "Traceback" not in done.stderr and "Injected" not in done.stdout
    assert not (tmp_path / "var").exists()  # refused before anything was opened


@pytest.mark.slow  # manage.py processes
def test_a_command_reads_the_hosts_env_file_for_its_database(tmp_path):
    env_file = tmp_path / "env"
    env_file.write_text("DATABASE_URL=postgres://console:pw@127.0.0.1:1/console\nSECRET_KEY=from-the-file\n")
    done = manage(*ENGINE, CONSOLE_ENV_FILE=str(env_file))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "django.db.backends.postgresql"
    assert f"the database and settings of {env_file}" in done.stderr
    # The process's own DATABASE_URL wins over the file.
    explicit = manage(*ENGINE, CONSOLE_ENV_FILE=str(env_file), DATABASE_URL=f"sqlite:///{tmp_path / 'x.sqlite3'}")
    assert explicit.stdout.strip() == "django.db.backends.sqlite3", explicit.stderr


@pytest.mark.slow  # manage.py processes
def test_an_unreadable_env_file_is_refused_with_its_reason(tmp_path):
    done = manage(*ENGINE, CONSOLE_ENV_FILE=str(tmp_path))  # a directory: cannot be read as a file
    assert done.returncode == 2
    assert "cannot be read" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.slow  # manage.py processes
def test_the_embedded_default_is_unchanged(tmp_path):
    done = manage(*ENGINE, CONSOLE_ENV_FILE=str(tmp_path / "none"), CONSOLE_VAR_DIR=str(tmp_path / "var"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "django.db.backends.sqlite3"
