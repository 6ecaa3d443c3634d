"""Failover latency: fault injection → Running on a new node → first new log line, per phase."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import sys
import time

from agent import runfiles
from bench.failover.console import REPO, EmbeddedConsole
from bench.failover.timeline import Failover, read_back, wait_for, watch_failover

TICKER = REPO / "bench" / "failover" / "ticker.py"


def workload_command(workload: str, every: float) -> str:
    if workload == "train":
        return f"OMP_NUM_THREADS=1 python -m jobs.examples.train_ckpt --steps 100000000 --save-every 20 --sleep {every}"
    # The run's container sees only its own directories: the ticker goes in as the command's text.
    return f"python -u -c {shlex.quote(TICKER.read_text())} --every {every}"


def one_run(
    console: EmbeddedConsole,
    index: int,
    *,
    workload: str,
    every: float,
    rng: random.Random,
    timeout: float,
    die_first: bool = False,
    prefix: str = "latency",
) -> Failover:
    from django.conf import settings

    from failover.services.faults import clear_node, inject_fault
    from jobs.models import AttemptNode, JobAttempt, Node
    from logs.models import LogLine

    job = console.create_job(f"{prefix}-{index:03d}", workload_command(workload, every))
    # Running with output: attempt 1 runs and a few of its lines are stored.
    wait_for(
        lambda: (
            LogLine.objects.filter(job_id=job.pk, attempt=1).count() >= 3
            and JobAttempt.objects.filter(job_id=job.pk, number=1, state=JobAttempt.State.RUNNING).exists()
        ),
        timeout=timeout,
        what=f"job {job.pk} to run with output",
    )
    # Inject at a random point of the control loop's round, not right after the round that stored the lines.
    time.sleep(rng.uniform(0.05, 0.05 + 2 * console.interval))
    part = AttemptNode.objects.select_related("node").get(attempt__job_id=job.pk, attempt__number=1)
    node: Node = part.node
    gpu = part.gpu_indices[0]
    fo = Failover(job_id=job.pk, old_attempt=1, node_from=node.name, gpu=gpu)
    if die_first:
        # The process dies on its own (as a CUDA process does when its GPU falls off the bus),
        # then the fault is visible to the probe: detection is measured from this kill.
        pid_info = json.loads((settings.JOB_WORK_ROOT / str(job.pk) / "attempt-1" / "rank-0" / runfiles.PID_FILE).read_text())
        os.killpg(int(pid_info["pgid"]), signal.SIGKILL)
        fo.extra["killed_at"] = time.time()
    fault = inject_fault(node, gpu=gpu, xid=79, actor="bench")
    try:
        fo.running_seen, fo.first_line_seen, _ = watch_failover(job.pk, 1, timeout=timeout)
        read_back(fo, fault.pk)
    finally:
        # Capacity back for the next run, and the job out of the way.
        clear_node(node, actor="bench")
        fo.extra["stopped_as"] = console.stop_job(job)
    return fo


def num(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"


def run_latency(
    console: EmbeddedConsole,
    *,
    runs: int,
    workload: str,
    every: float,
    seed: int,
    timeout: float,
    die_first: bool = False,
    log=print,
    prefix: str = "latency",
) -> list[Failover]:
    rng = random.Random(seed)
    samples: list[Failover] = []
    for i in range(1, runs + 1):
        try:
            fo = one_run(console, i, workload=workload, every=every, rng=rng, timeout=timeout, die_first=die_first, prefix=prefix)
        except TimeoutError as exc:
            log(f"  run {i:>2}: FAILED: {exc}")
            fo = None
        if fo is not None:
            p = fo.phases()
            log(
                f"  run {i:>2}: job {fo.job_id} {fo.node_from}/gpu{fo.gpu} → {fo.node_to or '?'}  verdict={fo.verdict or '?'}  "
                f"fault→Running {num(p['TOTAL fault → Running'])}s  "
                f"fault→first line {num(p['TOTAL fault → first new line (ts)'])}s  "
                f"(stored {num(p['TOTAL fault → first new line stored'])}s)  "
                f"[applied {num(p['inject→applied (agent round picks the fault up)'])} detect {num(p['detection (process died → attempt ended)'])} "
                f"decide {num(p['decision (ended → verdict stored)'])} place {num(p['placement (verdict → next attempt placed)'])} "
                f"launch {num(p['launch (placed → Running)'])} start {num(p['process start (Running → first line ts)'])}]"
            )
            samples.append(fo)
        sys.stdout.flush()
    return samples
