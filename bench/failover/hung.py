"""Detection of a hung rank: a run that stops printing and never exits by itself (it even ignores
SIGTERM) is on a GPU that falls off the bus. Measured per run: fault → every process of the run
gone (the health monitor's SIGKILL), fault → attempt ended, fault → Running again elsewhere."""

from __future__ import annotations

import json
import time

from agent import runfiles
from bench.failover.console import EmbeddedConsole
from bench.failover.stats import table
from bench.failover.timeline import wait_for, watch_failover

HUNG = "python -c \"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('step 1', flush=True); time.sleep(10**9)\""
PHASES = ("fault → processes gone", "fault → attempt ended", "fault → Running elsewhere")


def one_run(console: EmbeddedConsole, index: int, *, timeout: float) -> dict[str, float]:
    from django.conf import settings

    from agent.processes import run_processes
    from failover.services.faults import clear_node, inject_fault
    from jobs.models import AttemptNode, JobAttempt
    from logs.models import LogLine

    job = console.create_job(f"hung-{index:03d}", HUNG)
    wait_for(lambda: LogLine.objects.filter(job_id=job.pk, attempt=1).exists(), timeout=timeout, what=f"job {job.pk} to start")
    part = AttemptNode.objects.select_related("node").get(attempt__job_id=job.pk, attempt__number=1)
    pgid = int(json.loads((settings.JOB_WORK_ROOT / str(job.pk) / "attempt-1" / "rank-0" / runfiles.PID_FILE).read_text())["pgid"])
    time.sleep(0.5)  # hung: no more output, no exit
    started = time.time()
    inject_fault(part.node, kind="gpu_lost", gpu=part.gpu_indices[0], actor="bench")
    try:
        wait_for(
            lambda: not [p for p in run_processes(pgid) if p.is_running() and p.status() != "zombie"],
            timeout=timeout,
            poll=0.005,
            what="the hung run's processes to go",
        )
        gone = time.time()
        ended = wait_for(
            lambda: JobAttempt.objects.filter(job_id=job.pk, number=1).values_list("ended_at", flat=True).first(), timeout=timeout, what="the attempt to end"
        )
        running, _line, _number = watch_failover(job.pk, 1, timeout=timeout)
    finally:
        clear_node(part.node, actor="bench")
        console.stop_job(job)
    return dict(zip(PHASES, (gone - started, ended.timestamp() - started, running - started), strict=True))


def run_hung(console: EmbeddedConsole, *, runs: int, timeout: float, log=print) -> list[dict[str, float]]:
    samples = []
    for i in range(1, runs + 1):
        try:
            sample = one_run(console, i, timeout=timeout)
        except TimeoutError as exc:
            log(f"  hung run {i:>2}: FAILED: {exc}")
            continue
        log(f"  hung run {i:>2}: " + "  ".join(f"{k} {v:.3f}s" for k, v in sample.items()))
        samples.append(sample)
    return samples


def hung_report(samples: list[dict[str, float]], target: float, out: dict) -> tuple[bool, list[str]]:
    if not samples:
        return False, ["hung rank: no successful run"]
    rows = [(name, [s[name] for s in samples]) for name in PHASES]
    gone = sorted(s[PHASES[0]] for s in samples)
    worst = gone[-1]
    ok = worst <= target
    lines = [
        table(rows, title=f"Hung rank on a GPU that falls off the bus (ignores SIGTERM, prints nothing), {len(samples)} runs, seconds:"),
        f"  target: every process of the hung run gone ≤ {target:g} s after the fault: max {worst:.3f} s  {'PASS' if ok else 'FAIL'}",
    ]
    out["hung"] = {"runs": samples, "ok": ok}
    return ok, lines
