"""A throw-away scale-out cluster on loopback: a fresh PostgreSQL database, a flushed Redis
database, the (instrumented) control worker with beat and N node-agent processes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from agent.runner import kill_unfinished_runs

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable


def pg_connect(url: str):
    import psycopg

    return psycopg.connect(url.replace("postgres://", "postgresql://"), autocommit=True, connect_timeout=5)


class Cluster:
    """One scenario's processes. ``reset()`` makes a fresh database; ``start(agents)`` the rest."""

    def __init__(self, tmp: Path, pg_url: str, redis_url: str, db_name: str, gpus_per_agent: int, *, root: Path = ROOT) -> None:
        self.tmp = tmp
        self.root = root  # the source tree the processes run from (their working directory)
        self.admin_url = pg_url
        self.db_name = db_name
        self.redis_url = redis_url
        self.env = {
            **os.environ,
            "DATABASE_URL": f"{pg_url.rsplit('/', 1)[0]}/{db_name}",
            "REDIS_URL": redis_url,
            "CONSOLE_VAR_DIR": str(tmp / "var"),
            "JOB_WORK_ROOT": str(tmp / "jobs-none"),
            "SECRET_KEY": "bench-scale-secret",
            "CONSOLE_ADMIN_PASSWORD": "bench-scale-pass",
            "SIMULATED_GPUS": "1",
            "SIMULATED_GPUS_PER_NODE": str(gpus_per_agent),
            "LOG_LEVEL": "WARNING",
            "PYTHONUNBUFFERED": "1",
        }
        self.procs: dict[str, subprocess.Popen] = {}
        self.stats_path = tmp / "control-rounds.jsonl"

    # --- database and broker ---------------------------------------------------------------
    def sql(self, statement: str) -> None:
        with pg_connect(self.admin_url) as conn:
            conn.execute(statement)

    def redis(self):
        import redis

        return redis.Redis.from_url(self.redis_url)

    def reset(self, label: str) -> None:
        """A fresh database (migrated, operator account, default image), an empty Redis db and a
        fresh JOB_WORK_ROOT (job ids start again at 1: old run files must not be found)."""
        self.env["JOB_WORK_ROOT"] = str(self.tmp / f"jobs-{label}")
        self.drop()
        self.redis().flushdb()
        self.sql(f'CREATE DATABASE "{self.db_name}"')
        done = subprocess.run([PY, "manage.py", "bootstrap", "--no-nodes"], check=False, cwd=self.root, env=self.env, capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"bootstrap failed:\n{done.stdout}\n{done.stderr}")

    def pg_transactions(self) -> int:
        """Committed + rolled-back transactions of the bench database so far (every statement
        outside a transaction block is one): an idle cluster's polling load."""
        with pg_connect(self.admin_url) as conn:
            row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", [self.db_name]).fetchone()
        return int(row[0]) if row else 0

    def drop(self) -> None:
        self.sql(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')

    # --- processes -------------------------------------------------------------------------
    def start(self, agents: int) -> list[str]:
        self.stats_path.unlink(missing_ok=True)
        self.spawn("control", [PY, "-m", "bench.scale.control", str(self.stats_path), str(self.tmp / "beat-schedule")])
        names = [f"scale-{i:02d}" for i in range(1, agents + 1)]
        for name in names:
            self.spawn(f"agent-{name}", [PY, "manage.py", "nodeagent", "--name", name, "--simulated"])
        # A queue is consumed once its worker declared it (kombu keeps a binding set per queue).
        keys = ["_kombu.binding.control"] + [f"_kombu.binding.node.{n}" for n in names]
        r = self.redis()
        self.wait(lambda: all(r.exists(k) for k in keys), f"{agents} node agents and the control worker", timeout=180)
        return names

    def spawn(self, key: str, argv: list[str]) -> None:
        with open(self.tmp / f"{key}.log", "ab") as log:  # the child holds its own copy
            self.procs[key] = subprocess.Popen(argv, cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def pids(self, prefix: str) -> list[int]:
        return [p.pid for k, p in self.procs.items() if k.startswith(prefix)]

    def check_alive(self, what: str = "the jobs") -> None:
        dead = [k for k, p in self.procs.items() if p.poll() is not None]
        if dead:
            raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}; see {self.tmp}/*.log:\n{self.tail(dead[0])}")

    def wait(self, condition, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            self.check_alive(what)
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(0.2)

    def tail(self, key: str, chars: int = 2000) -> str:
        try:
            return (self.tmp / f"{key}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """End every process this cluster started (process groups: a Celery worker's beat child
        too), then any run a node agent left behind (runners live in their own sessions)."""
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 15
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        self.procs.clear()
        self.kill_runs()

    def kill_runs(self) -> None:
        for root in self.tmp.glob("jobs-*"):
            kill_unfinished_runs(root)
