"""One scenario: start a cluster of N agents, queue the jobs, follow them to the end, measure."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent import runfiles
from bench.scale import cpu
from bench.scale.cluster import Cluster
from bench.scale.stats import summary


@dataclass
class Result:
    label: str
    agents: int
    gpus: int
    jobs: int
    statuses: dict[str, int] = field(default_factory=dict)
    figures: dict = field(default_factory=dict)
    latency: dict[str, dict] = field(default_factory=dict)
    cpu: dict = field(default_factory=dict)
    idle_cpu: dict = field(default_factory=dict)
    timed_out: bool = False


def submit(count: int, command: str, gpus_per_job: int, mode: str, label: str) -> list[int]:
    """Queue ``count`` jobs. ``bulk``: one transaction (rows, their creation events, one placement
    request), as a batch submission. ``each``: ``create_job`` per job, as the form and the API
    do, each with its own placement request."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from jobs.models import JobEvent, TrainingJob
    from jobs.services.creation import create_job, personal_project_for
    from jobs.services.messages import request_placement

    owner = get_user_model().objects.get(username="admin")
    project = personal_project_for(owner)
    fields = dict(project=project, image=settings.DEFAULT_IMAGE, command=command, gpus_per_node=gpus_per_job, node_count=1)
    if mode == "each":
        return [create_job(owner=owner, actor="bench", name=f"{label}-{i:05d}", **fields).pk for i in range(count)]
    with transaction.atomic():
        jobs = TrainingJob.objects.bulk_create([TrainingJob(owner=owner, name=f"{label}-{i:05d}", **fields) for i in range(count)])
        JobEvent.objects.bulk_create([JobEvent(job=j, from_status="", to_status=j.status, reason="job created", actor="bench") for j in jobs])
        request_placement()
    return [j.pk for j in jobs]


def run_scenario(
    cluster: Cluster, *, label: str, agents: int, gpus_per_agent: int, jobs: int, command: str, gpus_per_job: int, submit_mode: str, timeout: float, log=print
) -> Result:
    from django.db import connections
    from django.db.models import Count

    from jobs.models import GPU, Node, TrainingJob
    from jobs.statuses import TERMINAL

    result = Result(label=label, agents=agents, gpus=agents * gpus_per_agent, jobs=jobs)
    connections.close_all()
    cluster.reset(label)
    t0 = time.monotonic()
    cluster.start(agents)
    cluster.wait(
        lambda: GPU.objects.filter(node__state=Node.State.READY).count() == agents * gpus_per_agent, f"{agents * gpus_per_agent} GPUs registered", timeout=120
    )
    log(f"[{label}] cluster up in {time.monotonic() - t0:.1f}s: {agents} node agents x {gpus_per_agent} simulated GPUs + control worker")
    control, agent_pids = cluster.pids("control"), cluster.pids("agent-")
    time.sleep(2.0)  # let start-up work settle
    x0, a = cluster.pg_transactions(), cpu.Snapshot(control, agent_pids)
    time.sleep(5.0)
    result.idle_cpu = cpu.delta(a, cpu.Snapshot(control, agent_pids))
    time.sleep(1.0)  # PostgreSQL publishes its counters about once a second
    result.idle_cpu["pg_tx_per_s"] = (cluster.pg_transactions() - x0) / 6.0

    r = cluster.redis()
    start = cpu.Snapshot(control, agent_pids)
    t_submit = time.time()
    ids = submit(jobs, command, gpus_per_job, submit_mode, label)
    t_queued = time.time()
    log(f"[{label}] queued {jobs} jobs ({submit_mode}) in {t_queued - t_submit:.2f}s")
    max_control_queue = 0
    deadline = time.monotonic() + timeout
    next_report = time.monotonic() + 5
    while True:
        counts = dict(TrainingJob.objects.filter(pk__in=ids).values_list("status").annotate(n=Count("id")))
        finished = sum(counts.get(s, 0) for s in TERMINAL)
        max_control_queue = max(max_control_queue, r.llen("control"))
        if finished >= jobs:
            break
        if time.monotonic() > deadline:
            result.timed_out = True
            log(f"[{label}] TIMED OUT after {timeout:.0f}s")
            break
        if time.monotonic() >= next_report:
            next_report += 5
            log(
                f"[{label}] t={time.time() - t_submit:6.1f}s  "
                + "  ".join(f"{k}={v}" for k, v in sorted(counts.items()))
                + f"  control-queue={r.llen('control')}"
            )
        cluster.check_alive()
        time.sleep(0.25)
    t_end = time.time()
    result.cpu = cpu.delta(start, cpu.Snapshot(control, agent_pids))
    result.statuses = dict(TrainingJob.objects.filter(pk__in=ids).values_list("status").annotate(n=Count("id")))
    collect(cluster, result, ids, t_submit, t_queued, t_end, max_control_queue)
    cluster.stop()
    connections.close_all()
    return result


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(cluster: Cluster, result: Result, ids: list[int], t_submit: float, t_queued: float, t_end: float, max_control_queue: int) -> None:
    from jobs.models import JobAttempt, TrainingJob

    jobs = {j["id"]: j for j in TrainingJob.objects.filter(pk__in=ids).values("id", "created_at", "finished_at", "failover_count")}
    attempts = list(JobAttempt.objects.filter(job_id__in=ids).values("job_id", "number", "created_at", "started_at", "ended_at"))
    ts = lambda d: d.timestamp() if d else None  # noqa: E731
    created = sorted(ts(a["created_at"]) for a in attempts)
    work = Path(cluster.env["JOB_WORK_ROOT"])
    spec_lag, runner_lag, start_lag, dispatch, queue_wait, exit_lag, run_s = [], [], [], [], [], [], []
    for a in attempts:
        c, s, e = ts(a["created_at"]), ts(a["started_at"]), ts(a["ended_at"])
        rank0 = work / str(a["job_id"]) / f"attempt-{a['number']}" / "rank-0"
        try:
            spec = (rank0 / runfiles.SPEC_FILE).stat().st_mtime
        except OSError:
            spec = None
        pid = (read_json(rank0 / runfiles.PID_FILE) or {}).get("started_at")
        ended = (read_json(rank0 / runfiles.EXIT_FILE) or {}).get("ended_at")
        if s is not None:
            dispatch.append(s - c)
        if spec is not None:
            spec_lag.append(spec - c)
            if pid is not None:
                runner_lag.append(pid - spec)
            if s is not None:
                start_lag.append(s - spec)
        if a["number"] == 1:
            queue_wait.append(c - ts(jobs[a["job_id"]]["created_at"]))
        if ended is not None and e is not None:
            exit_lag.append(e - ended)
        if pid is not None and ended is not None:
            run_s.append(ended - pid)
    result.latency = {
        "dispatch-to-start (attempt created -> started_at)": summary(dispatch),
        "  created -> agent wrote spec.json (commit, broker, agent claim)": summary(spec_lag),
        "  spec.json -> runner up (pid.json)": summary(runner_lag),
        "  spec.json -> started_at (run_started)": summary(start_lag),
        "queue wait (job created -> attempt created)": summary(queue_wait),
        "run (runner up -> exit.json)": summary(run_s),
        "exit seen (exit.json -> attempt ended_at)": summary(exit_lag),
    }
    rounds = [json.loads(line) for line in cluster.stats_path.read_text().splitlines() if line.strip()]
    rounds = [x for x in rounds if x["t"] >= t_submit or x.get("placed")]
    productive = [x for x in rounds if x.get("placed")]
    placed = sum(x.get("placed", 0) for x in rounds)
    finished = [ts(j["finished_at"]) for j in jobs.values() if j["finished_at"]]
    makespan = (max(finished) - t_submit) if finished else float("nan")
    burst = max(productive, key=lambda x: x["placed"], default=None)
    span = (created[-1] - created[0]) if len(created) > 1 else float("nan")
    result.figures = {
        "attempts": len(attempts),
        "failovers": sum(j["failover_count"] for j in jobs.values()),
        "submit_s": t_queued - t_submit,
        "makespan_s": makespan,
        "wall_s": t_end - t_submit,
        "placement_rate_observed": (len(created) - 1) / span if span and span == span else float("nan"),
        "placement_span_s": span,
        "placement_rate_engine": placed / sum(x["place_s"] for x in productive) if productive else float("nan"),
        "burst_placed": burst["placed"] if burst else 0,
        "burst_rate": burst["placed"] / burst["place_s"] if burst else float("nan"),
        "completion_rate": len(finished) / makespan if finished else float("nan"),
        "rounds": len(rounds),
        "rounds_productive": len(productive),
        "round_s_p50": summary([x["round_s"] for x in rounds])["p50"],
        "round_s_max": max((x["round_s"] for x in rounds), default=float("nan")),
        "control_busy_s": sum(x["round_s"] for x in rounds),
        "placed_in_rounds": placed,
        "queries_place_total": sum(x.get("place_q", 0) for x in rounds),
        "queries_place_productive": sum(x.get("place_q", 0) for x in productive),
        "queries_round_total": sum(x["round_q"] for x in rounds),
        "queries_burst": burst["place_q"] if burst else 0,
        "queries_empty_round_p50": summary([x.get("place_q", 0) for x in rounds if not x.get("placed")])["p50"],
        "max_control_queue": max_control_queue,
    }
