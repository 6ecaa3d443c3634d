"""A scale-out cluster on loopback for the scale-out tests: PostgreSQL, Redis, two Daphne
processes, a Celery control worker with beat, and one node agent process per node.

``scaleout_cluster`` (a fixture: the root conftest registers this module) is a started ``Cluster``
for one test; a module that needs another kind of cluster (``ProcfileCluster``, or a subclass of
its own) makes its fixture with ``running_cluster``."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.processes import PY, ROOT, free_port


def reachable(url: str) -> str | None:
    """None if the service answers, else why not."""
    try:
        if url.startswith("redis"):
            import redis

            redis.Redis.from_url(url, socket_connect_timeout=2).ping()
        else:
            import psycopg

            psycopg.connect(url.replace("postgres://", "postgresql://"), connect_timeout=2).close()
    except Exception as exc:
        return f"{url}: {exc}"
    return None


# A test process's own Redis database: TEST_REDIS_URL's number or one of the seven below it. Lanes
# and xdist workers run at once, and every Redis test flushes or deletes keys it does not name
# (heartbeats, Celery's queues): two processes on one database would read and flush each other's.
REDIS_DATABASES = 8


@functools.cache
def own_redis_database(url: str) -> str:
    """``url`` with the database number of this test process: the first of ``url``'s number and the
    seven below it that no other process holds (an ``flock`` on a file in /tmp, held until this
    process ends), waiting for ``url``'s own where all eight are held."""
    base, _, number = url.rpartition("/")
    if "//" not in base or not number.isdigit():
        base, number = url.rstrip("/"), "0"
    first = int(number)
    server = hashlib.sha256(base.encode()).hexdigest()[:12]
    candidates = [db for db in range(first, first - REDIS_DATABASES, -1) if db >= 0]
    for db, wait in [*((db, False) for db in candidates), (first, True)]:
        try:  # another user's lock file (a shared /tmp) is another user's database: not ours
            fd = os.open(f"/tmp/satrain-redis-{server}-{db}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        except PermissionError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return f"{base}/{db}"  # fd is never closed: its lock holds the database until this process ends
    raise AssertionError(f"no Redis database of {url} and the {REDIS_DATABASES - 1} below it is this user's to lock (/tmp/satrain-redis-*.lock)")


def services_or_skip() -> tuple[str, str]:
    pg = os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    rd = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
    problems = [p for p in (reachable(pg), reachable(rd)) if p]
    if problems:
        message = "scale-out tests need PostgreSQL and Redis on loopback: " + "; ".join(problems)
        if os.environ.get("REQUIRE_SCALEOUT"):
            pytest.fail(message)
        pytest.skip(message)
    return pg, own_redis_database(rd)


def running_cluster(make, tmp: Path):
    """A test fixture's body: ``make(tmp, pg_url, redis_url)`` started, yielded, its processes'
    logs printed if the test failed, stopped."""
    pg, rd = services_or_skip()
    cluster = make(tmp, pg, rd)
    try:
        cluster.start()
        yield cluster
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        cluster.stop()


def control_worker(tmp: Path) -> list[str]:
    """The control worker's command line (Celery on the ``control`` queue with its beat), as
    deploy/Procfile starts it."""
    return [
        PY, "-m", "celery", "-A", "console", "worker", "-Q", "control", "-B", "-P", "solo", "-l", "WARNING",
        "-n", "control@%h", "--without-gossip", "--without-mingle", "-s", str(tmp / "beat-schedule"),
    ]  # fmt: skip


class Cluster:
    """The console on PostgreSQL and Redis: two Daphne processes, the control worker with beat,
    and the agents of node-a, node-b and node-c, each a process of its own."""

    def __init__(self, tmp: Path, pg_url: str, redis_url: str) -> None:
        self.tmp = tmp
        self.db_name = f"satrain_test_scaleout_{os.getpid()}_{int(time.time())}"  # a name no deployment uses
        self.admin_url = pg_url
        base = pg_url.rsplit("/", 1)[0]
        self.env = {
            **os.environ,
            "DATABASE_URL": f"{base}/{self.db_name}",
            "REDIS_URL": redis_url,
            "CONSOLE_VAR_DIR": str(tmp / "var"),
            "JOB_WORK_ROOT": str(tmp / "jobs"),
            "SECRET_KEY": "scaleout-test-secret",
            "CONSOLE_ADMIN_PASSWORD": "admin-pass-1",
            "NODE_HEARTBEAT_TIMEOUT": "4",
            "HEALTH_CHECK_INTERVAL": "1",
            "SIMULATED_GPUS": "1",
            "SIMULATED_GPUS_PER_NODE": "2",
            "STOP_GRACE_PERIOD": "3",
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: list[int] = []

    def sql(self, statement: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url.replace("postgres://", "postgresql://"), autocommit=True) as conn:
            conn.execute(statement)

    def start(self) -> None:
        import redis

        redis.Redis.from_url(self.env["REDIS_URL"]).flushdb()
        self.sql(f'CREATE DATABASE "{self.db_name}"')
        subprocess.run([PY, "manage.py", "bootstrap", "--no-nodes"], cwd=ROOT, env=self.env, check=True, capture_output=True)
        for _ in range(2):
            port = free_port()
            self.ports.append(port)
            self.spawn(f"daphne-{port}", [PY, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "console.asgi:application"])
        self.spawn(
            "control",
            control_worker(self.tmp),
        )
        for name in ("node-a", "node-b", "node-c"):
            self.start_agent(name)
        for port in self.ports:
            self.wait(lambda p=port: self.http_ok(p), f"daphne on {port}")

    def start_agent(self, name: str) -> None:
        self.spawn(f"agent-{name}", [PY, "manage.py", "nodeagent", "--name", name, "--simulated"])

    def spawn(self, key: str, argv: list[str]) -> None:
        with open(self.tmp / f"{key}.log", "ab") as log:  # the child holds its own copy
            self.procs[key] = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def kill(self, key: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(key)
        os.kill(proc.pid, sig)
        proc.wait(timeout=30)

    def stop(self) -> None:
        for _key, proc in list(self.procs.items()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.procs.clear()
        with contextlib.suppress(Exception):
            self.sql(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.tmp.glob("*.log")))

    @staticmethod
    def wait(condition, what: str, timeout: float = 60.0):
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = condition()
            except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError):
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            time.sleep(0.2)

    def http_ok(self, port: int) -> bool:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=5) as response:
            return response.status == 200

    def api(self, port: int, method: str, path: str, token: str | None = None, body: dict | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if token:
            request.add_header("Authorization", f"Token {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture
def scaleout_cluster(tmp_path: Path) -> Iterator[Cluster]:
    """A started ``Cluster`` of the test's own (skipped where PostgreSQL or Redis does not answer)."""
    yield from running_cluster(Cluster, tmp_path)


ENV_EXAMPLE = ROOT / "deploy" / "console.env.example"
HONCHO = ROOT / ".venv" / "bin" / "honcho"  # the Procfile runs .venv/bin/… too


def env_file_from_example(values: dict[str, str]) -> str:
    """deploy/console.env.example with its values replaced from ``values`` (the keys it names), and
    the other keys of ``values`` appended: what an operator writes to /etc/console/env."""
    lines, named = [], set()
    for line in ENV_EXAMPLE.read_text().splitlines():
        key, sep, _ = line.partition("=")
        if sep and not line.startswith("#") and key in values:
            line = f"{key}={values[key]}"
            named.add(key)
        lines.append(line)
    lines += [f"{key}={value}" for key, value in values.items() if key not in named]
    return "\n".join(lines) + "\n"


class ProcfileCluster(Cluster):
    """The cluster as docs/deployment.md starts it: an env file made from the example, the release
    step through ``honcho run``, then ``honcho start`` of deploy/Procfile's processes, one honcho
    for the control host's and one per node agent (NODE_NAME)."""

    SETTINGS = (
        "DATABASE_URL",
        "REDIS_URL",
        "CONSOLE_VAR_DIR",
        "JOB_WORK_ROOT",
        "SECRET_KEY",
        "CONSOLE_ADMIN_PASSWORD",
        "NODE_HEARTBEAT_TIMEOUT",
        "HEALTH_CHECK_INTERVAL",
        "SIMULATED_GPUS",
        "SIMULATED_GPUS_PER_NODE",
        "STOP_GRACE_PERIOD",
        "LOG_LEVEL",
        "PYTHONUNBUFFERED",
    )

    def __init__(self, tmp: Path, pg_url: str, redis_url: str) -> None:
        super().__init__(tmp, pg_url, redis_url)
        values = {key: self.env[key] for key in self.SETTINGS}
        values.update(ALLOWED_HOSTS="127.0.0.1,localhost", CSRF_TRUSTED_ORIGINS="http://127.0.0.1", CONSOLE_PUBLIC_URL="http://127.0.0.1")
        self.env_file = tmp / "console.env"
        self.env_file.write_text(env_file_from_example(values))
        self.env_file.chmod(0o600)
        # Only the honcho invocation's own variables beside the file: the scale-out settings come
        # from the file alone, as on a host.
        self.base_env = {k: v for k, v in os.environ.items() if k not in values and k not in ("DJANGO_SETTINGS_MODULE",)}

    def honcho(self, *args: str) -> list[str]:
        return [str(HONCHO), "--no-colour", "-e", str(self.env_file), "-f", "deploy/Procfile", "-d", ".", *args]

    def start(self) -> None:
        import redis

        redis.Redis.from_url(self.env["REDIS_URL"]).flushdb()
        self.sql(f'CREATE DATABASE "{self.db_name}"')
        release = subprocess.run(
            self.honcho("run", ".venv/bin/python", "manage.py", "bootstrap", "--no-nodes"),
            check=False,
            cwd=ROOT,
            env=self.base_env,
            capture_output=True,
            text=True,
        )
        assert release.returncode == 0, release.stdout + release.stderr
        self.ports = [free_port(), free_port()]
        self.spawn_with(
            "control-host",
            self.honcho("start", "web1", "web2", "control", "notify"),
            WEB1_PORT=str(self.ports[0]),
            WEB2_PORT=str(self.ports[1]),
            WEB_METRICS_DIR=str(self.tmp / "prometheus"),
        )
        for name in ("node-a", "node-b", "node-c"):
            self.start_agent(name)
        for port in self.ports:
            self.wait(lambda p=port: self.http_ok(p), f"daphne on {port}")

    def start_agent(self, name: str) -> None:
        self.spawn_with(f"agent-{name}", self.honcho("start", "nodeagent"), NODE_NAME=name)

    def spawn_with(self, key: str, argv: list[str], **extra: str) -> None:
        with open(self.tmp / f"{key}.log", "ab") as log:  # the child holds its own copy
            self.procs[key] = subprocess.Popen(argv, cwd=ROOT, env={**self.base_env, **extra}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def exited(self) -> list[str]:
        """The honcho-started processes that stopped: honcho's own lines saying so, and any honcho gone."""
        found = [key for key, proc in self.procs.items() if proc.poll() is not None]
        for path in self.tmp.glob("*.log"):
            found += [line for line in path.read_text(errors="replace").splitlines() if " stopped (rc=" in line or "stopped (signal" in line]
        return found
