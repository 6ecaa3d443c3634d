"""What an idle embedded console costs the database, and how fast it still places a new job.

``python -m bench.idle`` starts ``manage.py runconsole`` (what ``make run`` starts: Daphne and the
embedded control loop with its node agent) on PostgreSQL, 3 simulated nodes, no job, twice in one
run: first with ``CONTROL_WAKEUPS=0`` (the baseline: the control round every AGENT_POLL_INTERVAL
and an agent reconcile after each, as before wake-ups), then with the default (wake-ups). For
each it waits for start-up, reads ``pg_stat_database.xact_commit + xact_rollback`` of the bench's
own database over ``--seconds`` (split into ``--windows`` windows) and prints transactions per
second, then creates jobs and prints the time to placement (the job's first attempt created):

* through the API (``POST /api/v1/training-jobs/``): the console's own process wakes its round;
* through the service layer from this process (``jobs.services.creation.create_job``): another
  process, so the console learns of it through the wake file (``jobs.services.wakeups``).

and, last, injects a fault into an idle simulated node from this process (``inject_fault``, as
``manage.py inject_fault`` does) and prints the time until the console's health monitor applied it.

The readings are made from a connection to the ``postgres`` database, so none of them is counted
in the bench's database (nothing to subtract). PostgreSQL flushes a backend's counters when it
goes idle (at most once a second, else within 10 s), so a window's figure may carry a few of the
previous window's transactions.

Needs PostgreSQL on ``--pg`` (default ``postgres://postgres@127.0.0.1:5432``, trust auth); the
database ``--database`` (``idle_bench``) is dropped and created afresh for each console.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psycopg

from bench.logs.harness import free_port

REPO = Path(__file__).resolve().parents[2]
TARGET_TX_PER_S = 2.0
TARGET_PLACEMENT_S = 1.0
JOB_COMMAND = "python -c 'print(1)'"


def recreate_database(pg: str, name: str) -> None:
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def transactions(conn: psycopg.Connection, name: str) -> int:
    """Committed and rolled back transactions of database ``name`` so far (read from another database)."""
    conn.execute("SELECT pg_stat_clear_snapshot()")
    row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (name,)).fetchone()
    return int(row[0]) if row else 0


class Console:
    """``manage.py runconsole`` in a process of its own, its output kept for when it fails."""

    def __init__(self, env: dict[str, str], port: int) -> None:
        self.port = port
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "runconsole", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        threading.Thread(target=self.read, daemon=True).start()

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip())
            if "Simple AI Training console on" in line:
                self.ready.set()

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.2):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit("the console did not start:\n" + "\n".join(self.lines[-40:]))
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/api/v1/", timeout=2)
                return
            except urllib.error.HTTPError:
                return  # it answers
            except OSError:
                time.sleep(0.2)
        raise SystemExit("the console never answered HTTP")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def measure_idle(pg: str, name: str, seconds: float, windows: int) -> list[float]:
    rates = []
    span = seconds / windows
    with psycopg.connect(f"{pg}/postgres", autocommit=True) as conn:
        before, at = transactions(conn, name), time.monotonic()
        for _ in range(windows):
            time.sleep(max(0.0, at + span - time.monotonic()))
            after, now = transactions(conn, name), time.monotonic()
            rates.append((after - before) / (now - at))
            before, at = after, now
    return rates


def wait_placed(job_id: int, started: float, timeout: float = 30.0) -> float:
    from jobs.models import JobAttempt

    while not JobAttempt.objects.filter(job_id=job_id).exists():
        if time.monotonic() - started > timeout:
            return float("nan")
        time.sleep(0.005)
    return time.monotonic() - started


def place_through_api(port: int, token: str, label: str) -> float:
    body = json.dumps({"name": label, "command": JOB_COMMAND, "gpus_per_node": 1}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/v1/training-jobs/",
        data=body,
        method="POST",
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    started = time.monotonic()
    with urllib.request.urlopen(request, timeout=10) as response:
        job_id = json.loads(response.read())["id"]
    if os.environ.get("IDLE_BENCH_DEBUG"):
        print(f"  API answered in {time.monotonic() - started:.3f} s", flush=True)
    return wait_placed(job_id, started)


def place_from_this_process(user, label: str) -> float:
    from jobs.services.creation import create_job

    started = time.monotonic()
    job = create_job(owner=user, name=label, command=JOB_COMMAND, gpus_per_node=1)
    return wait_placed(job.pk, started)


def fault_applied_from_this_process() -> float:
    """Inject a fault into an idle simulated node from this process (as ``manage.py inject_fault``
    does) and time it until the console's health monitor has applied it; the node is cleared after."""
    from failover.models import SimulatedFault
    from failover.services.faults import clear_node, inject_fault
    from jobs.models import Node

    node = Node.objects.order_by("name").last()
    started = time.monotonic()
    fault = inject_fault(node, kind="xid", gpu=0, actor="bench.idle")
    while not SimulatedFault.objects.filter(pk=fault.pk, applied_at__isnull=False).exists():
        if time.monotonic() - started > 30:
            break
        time.sleep(0.005)
    took = time.monotonic() - started
    clear_node(node, actor="bench.idle")
    return took


def settle_jobs(timeout: float = 60.0) -> None:
    """Wait for the bench's jobs to end (they print one line), so the next console starts empty."""
    from jobs.models import TrainingJob
    from jobs.statuses import TERMINAL

    deadline = time.monotonic() + timeout
    while TrainingJob.objects.exclude(status__in=TERMINAL).exists() and time.monotonic() < deadline:
        time.sleep(0.2)


def run_console(mode: str, args, base_env: dict[str, str], var_dir: Path) -> dict:
    from django.db import connections

    connections.close_all()
    recreate_database(args.pg, args.database)
    port = free_port()
    env = {**base_env, "PORT": str(port), "CONTROL_WAKEUPS": "0" if mode == "baseline" else "1"}
    console = Console(env, port)
    try:
        console.wait_ready()
        time.sleep(args.settle)  # start-up's own rounds, registration and first beats are over
        rates = measure_idle(args.pg, args.database, args.seconds, args.windows)
        from django.contrib.auth import get_user_model
        from knox.models import AuthToken

        user = get_user_model().objects.create_user(f"bench-{mode}", password=None)
        token = AuthToken.objects.create(user)[1]
        api, here = [], []
        for n in range(args.placements):
            api.append(place_through_api(port, token, f"idle-api-{n}"))
            time.sleep(1.0)
            here.append(place_from_this_process(user, f"idle-cli-{n}"))
            time.sleep(1.0)
        settle_jobs()
        faults = []
        for _ in range(args.placements):
            faults.append(fault_applied_from_this_process())
            time.sleep(1.0)
    finally:
        console.stop()
        connections.close_all()
        if os.environ.get("IDLE_BENCH_DEBUG"):
            print("\n".join(console.lines[-60:]))
    return {"rates": rates, "api": api, "here": here, "faults": faults}


def spread(values: list[float], unit: str, digits: int = 2) -> str:
    return (
        f"mean {statistics.fmean(values):.{digits}f} {unit}  (min {min(values):.{digits}f}, max {max(values):.{digits}f}; "
        + ", ".join(f"{v:.{digits}f}" for v in values)
        + ")"
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.idle", description=__doc__.splitlines()[0])
    parser.add_argument("--pg", default="postgres://postgres@127.0.0.1:5432", help="PostgreSQL server (no database)")
    parser.add_argument("--database", default="idle_bench")
    parser.add_argument("--seconds", type=float, default=60.0, help="idle measurement per console")
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after start-up before measuring")
    parser.add_argument("--placements", type=int, default=3, help="jobs created per path (API, this process)")
    parser.add_argument("--no-baseline", action="store_true", help="measure the wake-ups only")
    args = parser.parse_args()

    var_dir = Path(tempfile.mkdtemp(prefix="idle-bench-"))
    base_env = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    base_env.update(
        {
            "DATABASE_URL": f"{args.pg}/{args.database}",
            "CONSOLE_VAR_DIR": str(var_dir),
            "SIMULATED_GPUS": "1",
            "SIMULATED_NODES": "3",
            "JOB_SANDBOX": "off",  # no image to build: the bench measures the control plane
            "CONSOLE_ADMIN_PASSWORD": "bench-not-secret-1",
            "LOG_LEVEL": base_env.get("LOG_LEVEL", "WARNING"),
        }
    )
    # This process reads and creates jobs in the same database and var dir (so its wake-ups
    # reach the console through the same wake file).
    for key in ("DATABASE_URL", "CONSOLE_VAR_DIR", "SIMULATED_GPUS", "JOB_SANDBOX"):
        os.environ[key] = base_env[key]
    os.environ.pop("REDIS_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    sys.path.insert(0, str(REPO))
    import django

    django.setup()

    modes = ["wakeups"] if args.no_baseline else ["baseline", "wakeups"]
    results = {}
    try:
        for mode in modes:
            print(f"[{mode}] starting runconsole on PostgreSQL ({args.database}), 3 simulated nodes ...", flush=True)
            results[mode] = run_console(mode, args, base_env, var_dir)
            r = results[mode]
            print(f"[{mode}] idle: {spread(r['rates'], 'tx/s')} over {args.seconds:.0f} s in {args.windows} windows", flush=True)
            print(f"[{mode}] placement through the API:      {spread(r['api'], 's', 3)}", flush=True)
            print(f"[{mode}] placement from another process: {spread(r['here'], 's', 3)}", flush=True)
            print(f"[{mode}] fault injected from another process, applied by the console: {spread(r['faults'], 's', 3)}", flush=True)
    finally:
        shutil.rmtree(var_dir, ignore_errors=True)

    new = results["wakeups"]
    idle = statistics.fmean(new["rates"])
    worst = max(new["api"] + new["here"])
    print()
    if "baseline" in results:
        old = statistics.fmean(results["baseline"]["rates"])
        print(f"idle transactions/s: baseline {old:.2f} → wake-ups {idle:.2f}  (ratio {old / idle if idle else float('inf'):.1f}×)")
    else:
        print(f"idle transactions/s: {idle:.2f} (baseline not run; the issue measured 18.2)")
    print(
        f"target ≤ {TARGET_TX_PER_S} tx/s: {'met' if idle <= TARGET_TX_PER_S else 'MISSED'};  "
        f"slowest placement {worst:.3f} s, target ≤ {TARGET_PLACEMENT_S} s: {'met' if worst <= TARGET_PLACEMENT_S else 'MISSED'}"
    )


if __name__ == "__main__":
    main()
