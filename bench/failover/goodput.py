"""Goodput: steps per hour of ``jobs.examples.train_ckpt`` with a hardware fault every F minutes,
against the same job without faults, measured in the same bench run."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from functools import partial

from bench.failover.console import EmbeddedConsole
from bench.failover.timeline import Failover, first_step, last_step, read_back, wait_for, watch_failover


def train_command(*, sleep: float, save_every: int) -> str:
    return f"python -m jobs.examples.train_ckpt --steps 100000000 --save-every {save_every} --sleep {sleep}"


def train_env(threads: int) -> dict:
    """The job's Environment variables: torch's intra-op threads (0: leave torch's default)."""
    return {"OMP_NUM_THREADS": str(threads)} if threads > 0 else {}


def fault_offsets(minutes: float, fault_every: float) -> list[float]:
    """Seconds after the job's submission: one fault in the middle of every F-minute slice of the
    window, so a window of D minutes holds D/F faults (the rate "one every F minutes")."""
    out, k = [], 0
    while (k + 0.5) * fault_every < minutes:
        out.append((k + 0.5) * fault_every * 60.0)
        k += 1
    return out


@dataclass
class GoodputRun:
    job_id: int
    label: str
    t0: float  # job submitted (created_at)
    window_s: float
    steps: int | None = None  # the step number printed last within the window
    first_step_ts: float | None = None  # first step line of attempt 1 (cold start ends)
    failovers: list[Failover] = field(default_factory=list)

    @property
    def steps_per_hour(self) -> float | None:
        return None if self.steps is None else self.steps * 3600.0 / self.window_s

    @property
    def steady_step_s(self) -> float | None:
        """Seconds per step once running (cold start excluded), from the fault-free stretch."""
        if self.steps is None or self.first_step_ts is None:
            return None
        span = self.t0 + self.window_s - self.first_step_ts
        return span / self.steps if self.steps else None


def inject_into_running(console: EmbeddedConsole, job_id: int, *, timeout: float, log) -> tuple[Failover, int, object]:
    from failover.services.faults import inject_fault
    from jobs.models import AttemptNode, JobAttempt, TrainingJob
    from jobs.statuses import JobStatus

    # A fault is injected into a running job; if the previous failover is still going, wait for it.
    wait_for(
        lambda: TrainingJob.objects.filter(pk=job_id, status=JobStatus.RUNNING).exists(),
        timeout=timeout,
        what=f"job {job_id} to be Running before the next fault",
    )
    part = (
        AttemptNode.objects.select_related("node", "attempt")
        .filter(attempt__job_id=job_id, attempt__state=JobAttempt.State.RUNNING)
        .order_by("-attempt__number")
        .first()
    )
    fo = Failover(job_id=job_id, old_attempt=part.attempt.number, node_from=part.node.name, gpu=part.gpu_indices[0])
    fault = inject_fault(part.node, gpu=fo.gpu, xid=79, actor="bench")
    return fo, fault.pk, part.node


def fault_once(console: EmbeddedConsole, job_id: int, *, timeout: float, log, t0: float) -> Failover:
    """One hardware fault in the job's running attempt, followed to the new attempt's first
    training step; the node is repaired afterwards. ``extra`` holds the steps lost and the times."""
    from failover.services.faults import clear_node
    from jobs.models import JobExclusion

    fo, fault_id, node = inject_into_running(console, job_id, timeout=timeout, log=log)
    before = last_step(job_id, attempt=fo.old_attempt)
    try:
        fo.running_seen, fo.first_line_seen, new_number = watch_failover(job_id, fo.old_attempt, timeout=timeout)
        step = wait_for(partial(first_step, job_id, attempt=new_number), timeout=timeout, what="the first step after the failover")
        read_back(fo, fault_id)
    finally:
        # The operator repairs the node: it takes jobs again. The job's own exclusion of the
        # node is lifted too (the product has no command for that), so a 3-node pool can take
        # more than two faults of one job.
        clear_node(node, actor="bench")
        JobExclusion.objects.filter(job_id=job_id, node=node).delete()
    # Everything the killed run printed, including what came between the fault and the kill.
    final_old = last_step(job_id, attempt=fo.old_attempt) or before
    fo.extra.update(
        last_step_before=final_old[0] if final_old else None,
        last_step_before_ts=final_old[1] if final_old else None,
        first_step_after=step[0],
        first_step_after_ts=step[1],
        steps_lost=(final_old[0] - (fo.resume_step or 0)) if final_old else None,
        downtime_s=(step[1] - final_old[1]) if final_old else None,
        fault_to_first_step_s=step[1] - fo.fault_created,
    )
    p = fo.phases()
    log(
        f"  fault at +{fo.fault_created - t0:6.1f}s on {fo.node_from}/gpu{fo.gpu} → {fo.node_to}: "
        f"Running after {p['TOTAL fault → Running']:.3f}s, first line {p['TOTAL fault → first new line (ts)']:.3f}s, "
        f"first step {fo.extra['fault_to_first_step_s']:.3f}s; last step {fo.extra['last_step_before']} → resumed from "
        f"{fo.resume_step} (lost {fo.extra['steps_lost']} steps, {fo.extra['downtime_s']:.2f}s between step lines)"
    )
    sys.stdout.flush()
    return fo


def run_faulted(console: EmbeddedConsole, job, *, minutes: float, fault_every: float, timeout: float, log) -> GoodputRun:
    t0 = job.created_at.timestamp()
    run = GoodputRun(job_id=job.pk, label="faults", t0=t0, window_s=minutes * 60.0)
    for offset in fault_offsets(minutes, fault_every):
        delay = t0 + offset - time.time()
        if delay > 0:
            time.sleep(delay)
        run.failovers.append(fault_once(console, job.pk, timeout=timeout, log=log, t0=t0))
    return run


def finish(run: GoodputRun, *, interval: float) -> None:
    """Wait for the window's end (plus ingestion), then read the step reached within it."""
    end = run.t0 + run.window_s
    delay = end + 3 * interval + 1.0 - time.time()
    if delay > 0:
        time.sleep(delay)
    reached = last_step(run.job_id, until=end)
    run.steps = reached[0] if reached else 0
    first = first_step(run.job_id, attempt=1)
    run.first_step_ts = first[1] if first else None


def run_goodput(
    console: EmbeddedConsole,
    *,
    minutes: float,
    fault_every: float,
    sleep: float,
    save_every: int,
    sequential: bool,
    timeout: float,
    threads: int = 1,
    log=print,
) -> tuple[GoodputRun, GoodputRun]:
    command = train_command(sleep=sleep, save_every=save_every)
    env = train_env(threads)
    baseline_job = console.create_job("goodput-baseline", command, env=env)
    if sequential:
        baseline = GoodputRun(job_id=baseline_job.pk, label="baseline", t0=baseline_job.created_at.timestamp(), window_s=minutes * 60.0)
        log(f"  baseline (no faults) for {minutes:g} min …")
        finish(baseline, interval=console.interval)
        console.stop_job(baseline_job)
    faulted_job = console.create_job("goodput-faults", command, env=env)
    if not sequential:
        baseline = GoodputRun(job_id=baseline_job.pk, label="baseline", t0=baseline_job.created_at.timestamp(), window_s=minutes * 60.0)
    log(
        f"  faulted run for {minutes:g} min, faults at +{', +'.join(f'{o:.0f}s' for o in fault_offsets(minutes, fault_every))}"
        + ("" if sequential else " (the fault-free baseline runs alongside)")
    )
    sys.stdout.flush()
    faulted = run_faulted(console, faulted_job, minutes=minutes, fault_every=fault_every, timeout=timeout, log=log)
    finish(faulted, interval=console.interval)
    if not sequential:
        finish(baseline, interval=console.interval)
    console.stop_job(faulted_job)
    if not sequential:
        console.stop_job(baseline_job)
    return baseline, faulted
