"""The bench's own console install: a temp var dir with SQLite, Django set up in-process, and the
console (``manage.py runconsole``) as a subprocess on the same database."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

from agent.runner import kill_unfinished_runs

REPO = Path(__file__).resolve().parents[2]
ADMIN_PASSWORD = "bench-logs-not-secret"


def console_env(var_dir: Path, *, verbose: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        DJANGO_SETTINGS_MODULE="console.settings",
        CONSOLE_VAR_DIR=str(var_dir),
        SQLITE_PATH=str(var_dir / "console.sqlite3"),
        JOB_WORK_ROOT=str(var_dir / "jobs"),
        CONSOLE_ADMIN_PASSWORD=ADMIN_PASSWORD,
        SIMULATED_GPUS="1",
        PYTHONUNBUFFERED="1",
    )
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    if not verbose:
        env["LOG_LEVEL"] = "WARNING"
    return env


def setup_django(var_dir: Path, *, verbose: bool = False) -> None:
    """Point this process's settings at ``var_dir``, set Django up and migrate/bootstrap."""
    os.environ.update(console_env(var_dir, verbose=verbose))
    import django

    django.setup()
    from django.core.management import call_command

    call_command("bootstrap", no_nodes=True, stdout=io.StringIO())


def start_publish_loop() -> asyncio.AbstractEventLoop:
    """An event loop in a thread, registered as 'the server loop', so that ``publish`` from the
    ingesting thread hands messages over with ``run_coroutine_threadsafe`` as in the console."""
    from jobs.realtime import remember_server_loop

    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)

        def remember() -> None:
            remember_server_loop()
            ready.set()

        loop.call_soon(remember)
        loop.run_forever()

    threading.Thread(target=run, name="bench-publish-loop", daemon=True).start()
    ready.wait(5)
    return loop


def admin_user():
    from django.contrib.auth import get_user_model

    return get_user_model().objects.get(username="admin")


def finished_job(name: str):
    """A Completed job of the operator (so no agent ever places it)."""
    from django.conf import settings

    from jobs.models import TrainingJob
    from jobs.services.creation import create_job
    from jobs.statuses import JobStatus

    job = create_job(owner=admin_user(), name=name, image=settings.DEFAULT_IMAGE, command="python -c pass", gpus_per_node=1, node_count=1)
    TrainingJob.objects.filter(pk=job.pk).update(status=JobStatus.COMPLETED)
    return job


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ConsoleProcess:
    """``manage.py runconsole`` on a free port, its output in ``var_dir/console.out``."""

    def __init__(self, var_dir: Path, *, verbose: bool = False, probe: bool = False) -> None:
        self.var_dir = var_dir
        self.verbose = verbose
        # With probe, the console runs under bench.logs.probe (timers, written at exit).
        self.probe_path = var_dir / "probe.json" if probe else None
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.token: str | None = None

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        with open(self.var_dir / "console.out", "ab") as out:  # the child holds its own copy
            self.proc = subprocess.Popen(
                ([sys.executable, "-m", "bench.logs.probe", str(self.probe_path)] if self.probe_path else [sys.executable, "manage.py"])
                + ["runconsole", "--port", str(self.port)],
                cwd=str(REPO),
                env=console_env(self.var_dir, verbose=self.verbose),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the console exited with {self.proc.returncode}; see {self.var_dir / 'console.out'}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.2)
        else:
            raise TimeoutError("the console did not start listening")
        self.token = self.api("POST", "/api/v1/auth/token/", {"username": "admin", "password": ADMIN_PASSWORD}, auth=False)["token"]

    def api(self, method: str, path: str, body: dict | None = None, *, auth: bool = True) -> dict:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if auth:
            headers["Authorization"] = f"Token {self.token}"
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        with urllib.request.urlopen(req, timeout=30) as resp:
            return json.loads(resp.read())

    def get_raw(self, path: str) -> bytes:
        req = urllib.request.Request(self.base + path, headers={"Authorization": f"Token {self.token}", "Accept": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.read()

    def probe_stats(self) -> dict:
        try:
            return json.loads(self.probe_path.read_text()) if self.probe_path else {}
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        kill_unfinished_runs(self.var_dir / "jobs")
