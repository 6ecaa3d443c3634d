"""``python -m bench.failover.lostnode [--runs N] [--before-runs M] [--lease S] [--before-lease S]``

A lost node in scale-out, measured end to end: PostgreSQL and Redis on loopback (``TEST_POSTGRES_URL``;
Redis database 11, flushed: ``BENCH_LOSTNODE_REDIS_URL``), the product's control worker with beat and three node
agents (``manage.py nodeagent --simulated``, one GPU each) in a throw-away database
(``bench.scale.cluster``). Each run queues a printing job, waits until it is ``Running``, SIGKILLs
its node's agent at a random moment of the beat cycle (the run itself lives on, a stray, as on a
node whose agent or network died), and measures:

* **last beat → Running elsewhere**: from the node's last heartbeat in Redis to the next attempt's
  start (what an operator's outage is);
* **agent killed → Running elsewhere**;
* **the recovery metric**: what ``satrain_failover_recovery_seconds`` recorded for that failover
  (its ``_sum`` before and after, from the product's own ``/metrics`` collector);
* **the old metric's figure**: the closed run's end → Running (what the metric counted before it
  counted from the last heartbeat).

Then the job is stopped, the agent started again (its node comes back Ready, and it ends the
stray). ``--before-runs`` runs first with ``--before-lease`` (90 s: the old default), in the same
invocation, then ``--runs`` with ``--lease`` (default: the settings' scale-out default, 12 s).

Target: lost node → Running elsewhere p95 ≤ lease + 5 s, and the metric equal to it (within 0.5 s).
Exit status: 0 met, 1 missed, 2 the bench could not run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.failover.stats import median, p95
from bench.scale.cluster import PY, Cluster

COMMAND = "python -u -c \"import time\nfor i in range(100000):\n    print('step', i, flush=True); time.sleep(0.2)\""
TARGET_SLACK_S = 5.0  # lease + this: a beat interval, a 1 s control round, placement and the launch
METRIC_TOLERANCE_S = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.failover.lostnode", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=10, help="lost-node failovers with --lease (10)")
    p.add_argument("--lease", type=float, default=None, help="NODE_HEARTBEAT_TIMEOUT (default: the scale-out default, 12)")
    p.add_argument("--before-runs", type=int, default=0, help="failovers first with --before-lease (0)")
    p.add_argument("--before-lease", type=float, default=90.0, help="NODE_HEARTBEAT_TIMEOUT of the before runs (90: the old default)")
    p.add_argument("--pg", default=os.environ.get("TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"))
    p.add_argument(
        "--redis",
        default=os.environ.get("BENCH_LOSTNODE_REDIS_URL", "redis://127.0.0.1:6379/11"),
        help="a Redis database of its own, flushed at each phase's start (db 11)",
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=None, help="also write every sample to this file")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (process logs)")
    return p.parse_args(argv)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class LostNodeBench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args = args
        self.cluster = Cluster(tmp, args.pg, args.redis, f"satrain_bench_lostnode_{os.getpid()}", 1)
        self.cluster.env.update({"JOB_SANDBOX": os.environ.get("JOB_SANDBOX", "off"), "STOP_GRACE_PERIOD": "2", "HEALTH_CHECK_INTERVAL": "5"})
        self.names: list[str] = []
        self.django_ready = False

    # --- the cluster ---------------------------------------------------------------------------
    def start(self, lease: float | None) -> None:
        if lease is None:
            self.cluster.env.pop("NODE_HEARTBEAT_TIMEOUT", None)
        else:
            self.cluster.env["NODE_HEARTBEAT_TIMEOUT"] = f"{lease:g}"
        self.cluster.reset(f"lease{lease or 'default'}")
        if not self.django_ready:
            # This process reads (and queues jobs in) the bench database with the product's own code.
            os.environ.update(
                {k: v for k, v in self.cluster.env.items() if k in ("DATABASE_URL", "REDIS_URL", "CONSOLE_VAR_DIR", "SECRET_KEY", "JOB_WORK_ROOT")}
            )
            os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
            import django

            django.setup()
            self.django_ready = True
        from django.db import connections

        connections.close_all()  # a fresh database each phase
        self.names = self.cluster.start(3)
        self.wait_ready(self.names)

    def stop(self) -> None:
        from django.db import connections

        connections.close_all()
        self.cluster.stop()

    def lease_in_force(self) -> float:
        """The lease the cluster's processes run with (the settings' default when not given)."""
        import subprocess

        done = subprocess.run(
            [PY, "manage.py", "shell", "-c", "from django.conf import settings; print(settings.NODE_HEARTBEAT_TIMEOUT)"],
            cwd=self.cluster.root,
            env=self.cluster.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return float(done.stdout.strip().splitlines()[-1])

    def wait_ready(self, names: list[str], timeout: float = 120.0) -> None:
        from jobs.models import Node

        self.cluster.wait(lambda: Node.objects.filter(name__in=names, state=Node.State.READY).count() == len(names), f"{', '.join(names)} Ready", timeout)

    # --- one failover --------------------------------------------------------------------------
    def recovery_sum(self) -> tuple[float, float]:
        from console.prometheus import DatabaseCollector

        values = {s.name: s.value for family in DatabaseCollector().failover_families() for s in family.samples}
        return values.get("satrain_failover_recovery_seconds_sum", 0.0), values.get("satrain_failover_recovery_seconds_count", 0.0)

    def one(self, index: int, lease: float) -> dict:
        import redis
        from django.contrib.auth import get_user_model

        from jobs import heartbeats
        from jobs.models import JobAttempt, TrainingJob
        from jobs.services.actions import request_stop
        from jobs.services.creation import create_job, personal_project_for
        from jobs.statuses import JobStatus

        owner = get_user_model().objects.get(username="admin")
        job = create_job(
            owner=owner,
            actor="bench",
            name=f"lost-{index:03d}",
            project=personal_project_for(owner),
            image=self.cluster.env.get("DEFAULT_IMAGE") or _default_image(),
            command=COMMAND,
            gpus_per_node=1,
            node_count=1,
        )
        self.cluster.wait(
            lambda: (
                JobAttempt.objects.filter(job=job, number=1, started_at__isnull=False).exists()
                and TrainingJob.objects.get(pk=job.pk).status == JobStatus.RUNNING
            ),
            f"job {job.pk} Running",
            120,
        )
        first = JobAttempt.objects.get(job=job, number=1)
        node = first.placements.get().node.name
        time.sleep(1.0 + random.uniform(0, 3.0))  # past the start, at a random phase of the beat cycle
        sum0, count0 = self.recovery_sum()
        proc = self.cluster.procs.pop(f"agent-{node}")
        os.killpg(proc.pid, signal.SIGKILL)  # the agent, not its run (the runner has a session of its own)
        t_kill = time.time()
        proc.wait(timeout=30)
        score = redis.Redis.from_url(self.cluster.redis_url).zscore(heartbeats.BEATS, node)
        last_beat = float(score) if score is not None else None

        def resumed():
            second = JobAttempt.objects.filter(job=job, number=2, started_at__isnull=False).first()
            return second if second and TrainingJob.objects.get(pk=job.pk).status == JobStatus.RUNNING else None

        self.cluster.wait(lambda: resumed() is not None, f"job {job.pk} Running elsewhere after {node} was lost", lease + 120)
        second = resumed()
        first.refresh_from_db()
        sum1, count1 = self.recovery_sum()
        started = second.started_at.timestamp()
        sample = {
            "job": job.pk,
            "lost_node": node,
            "new_node": second.placements.get().node.name,
            "last_beat_to_running_s": started - last_beat if last_beat else None,
            "kill_to_running_s": started - t_kill,
            "metric_s": sum1 - sum0 if count1 == count0 + 1 else None,
            "old_metric_s": started - first.ended_at.timestamp(),
            "banner": TrainingJob.objects.get(pk=job.pk).status_reason,
        }
        log(
            f"  run {index}: {node} → {sample['new_node']}: last beat → Running {fmt(sample['last_beat_to_running_s'])}, "
            f"kill → Running {fmt(sample['kill_to_running_s'])}, metric {fmt(sample['metric_s'])} (old formula {fmt(sample['old_metric_s'])})"
        )
        request_stop(TrainingJob.objects.get(pk=job.pk), actor="bench")
        self.cluster.spawn(f"agent-{node}", [PY, "manage.py", "nodeagent", "--name", node, "--simulated"])
        self.wait_ready([node])
        self.cluster.wait(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.STOPPED, f"job {job.pk} Stopped", 60)
        return sample

    def phase(self, label: str, lease: float | None, runs: int) -> dict:
        self.start(lease)
        try:
            in_force = self.lease_in_force()
            log(f"{label}: NODE_HEARTBEAT_TIMEOUT {in_force:g}s, {runs} runs")
            samples = [self.one(i + 1, in_force) for i in range(runs)]
        finally:
            self.stop()
        return {"label": label, "lease_s": in_force, "samples": samples, "summary": summarise(samples)}


def _default_image() -> str:
    from django.conf import settings

    return settings.DEFAULT_IMAGE


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def summarise(samples: list[dict]) -> dict:
    out = {}
    for key in ("last_beat_to_running_s", "kill_to_running_s", "metric_s", "old_metric_s"):
        values = [s[key] for s in samples if s[key] is not None]
        out[key] = {"median": median(values), "p95": p95(values), "min": min(values), "max": max(values), "n": len(values)} if values else {}
    gaps = [abs(s["metric_s"] - s["last_beat_to_running_s"]) for s in samples if s["metric_s"] is not None and s["last_beat_to_running_s"]]
    out["metric_gap_max_s"] = max(gaps) if gaps else None
    return out


def print_phase(result: dict) -> None:
    rows = [
        ("lost node: last beat → Running elsewhere", "last_beat_to_running_s"),
        ("agent killed → Running elsewhere", "kill_to_running_s"),
        ("satrain_failover_recovery_seconds (recorded)", "metric_s"),
        ("old formula: closed run's end → Running", "old_metric_s"),
    ]
    print(f"\n{result['label']} (NODE_HEARTBEAT_TIMEOUT {result['lease_s']:g}s)")
    print(f"  {'figure':46}  {'median':>7}  {'p95':>7}  {'min':>7}  {'max':>7}  {'n':>3}")
    for title, key in rows:
        s = result["summary"][key]
        if s:
            print(f"  {title:46}  {s['median']:7.2f}  {s['p95']:7.2f}  {s['min']:7.2f}  {s['max']:7.2f}  {s['n']:>3}")
    gap = result["summary"]["metric_gap_max_s"]
    print(f"  metric vs last beat → Running: largest difference {fmt(gap)}")
    if result["samples"]:
        print(f"  banner: {result['samples'][-1]['banner']}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    random.seed(args.seed)
    from harness.scaleout import reachable

    problems = [p for p in (reachable(args.pg), reachable(args.redis)) if p]
    if problems:
        print("bench.failover.lostnode needs PostgreSQL and Redis: " + "; ".join(problems), file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="bench-lostnode-"))
    bench = LostNodeBench(args, tmp)
    results = []
    try:
        if args.before_runs:
            results.append(bench.phase("before (old default lease)", args.before_lease, args.before_runs))
        results.append(bench.phase("after", args.lease, args.runs))
    except Exception as exc:
        print(f"bench.failover.lostnode could not complete: {exc}\n(process logs in {tmp})", file=sys.stderr)
        bench.stop()
        return 2
    finally:
        bench.cluster.drop()
    for result in results:
        print_phase(result)
    after = results[-1]
    p95_running = after["summary"]["last_beat_to_running_s"].get("p95")
    gap = after["summary"]["metric_gap_max_s"]
    met_time = p95_running is not None and p95_running <= after["lease_s"] + TARGET_SLACK_S
    met_metric = gap is not None and gap <= METRIC_TOLERANCE_S
    print(f"\nlast beat → Running p95 ≤ lease + {TARGET_SLACK_S:g} s ({after['lease_s'] + TARGET_SLACK_S:g} s): {'PASS' if met_time else 'FAIL'}")
    print(f"recovery metric = last beat → Running (within {METRIC_TOLERANCE_S:g} s): {'PASS' if met_metric else 'FAIL'}")
    if args.json:
        args.json.write_text(json.dumps({"phases": results}, indent=2, default=str))
    if not args.keep:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"process logs kept in {tmp}")
    return 0 if met_time and met_metric else 1


if __name__ == "__main__":
    sys.exit(main())
