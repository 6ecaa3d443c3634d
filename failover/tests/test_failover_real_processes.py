"""Failover with real process trees and a stalled database, on the embedded agent.

* A torchrun job (2 workers, each in its own session) faulted during start-up and during training
  fails over with no process of its first attempt left (every process of the machine is checked
  with psutil, not only the run's process tree).
* A 40 s write lock on the SQLite database, held while the embedded agent runs, kills no job and
  makes no node NotReady or unhealthy.
"""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import threading
import time

import psutil
import pytest
from django.db import connection

from agent.processes import signal_run
from failover.services.faults import inject_fault
from harness.node_agent import pump_until
from jobs.models import AttemptNode, JobAttempt, Node, TrainingJob
from jobs.services.actions import request_stop
from jobs.statuses import JobStatus
from logs.models import LogLine

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_run_outlives_its_test")]

WORKER = (
    "import os, time, torch, torch.distributed as dist\\n"
    'dist.init_process_group("gloo")\\n'
    "rank = dist.get_rank()\\n"
    'print(f"worker {rank} of {dist.get_world_size()} up", flush=True)\\n'
    "for step in range(100000):\\n"
    "    t = torch.ones(1); dist.all_reduce(t)\\n"
    '    print(f"rank {rank} step {step}", flush=True); time.sleep(0.1)\\n'
)
TORCHRUN = (
    f"printf '{WORKER}' > $OUTPUT_DIR/failover_worker.py && "
    "python -m torch.distributed.run --standalone --nproc_per_node 2 --max_restarts 0 $OUTPUT_DIR/failover_worker.py"
)


def processes_of(job: TrainingJob, attempt: int) -> list[psutil.Process]:
    """Every live process on this machine started for that attempt of the job (by the
    platform's environment in the process's own: its JOB_ID and JOB_ATTEMPT; the processes in its
    container are the machine's processes too)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if "failover_worker.py" not in " ".join(process.info["cmdline"] or ()):
                continue
            env = process.environ()
            if process.status() != psutil.STATUS_ZOMBIE and env.get("JOB_ATTEMPT") == str(attempt) and env.get("JOB_ID") == str(job.pk):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def describe(processes) -> list:
    out = []
    for p in processes:
        with contextlib.suppress(psutil.Error):
            out.append((p.pid, p.status(), p.ppid(), " ".join(p.cmdline())[:80]))
    return out


def wait(agent, predicate, timeout: float, what: str) -> float:
    started = time.monotonic()

    def last_lines() -> str:
        return f"last lines: {list(LogLine.objects.order_by('-id').values_list('text', flat=True)[:15])[::-1]}"

    pump_until(agent, predicate, what, timeout=timeout, every=0.05, describe=last_lines)
    return time.monotonic() - started


def logged(job: TrainingJob, text: str) -> bool:
    return LogLine.objects.filter(job=job, text__contains=text).exists()


@pytest.mark.django_db
@pytest.mark.parametrize("when", ["start-up", "training"])
def test_a_torchrun_job_faulted_fails_over_with_no_process_of_its_first_attempt_left(make_job, drive, agent, when):
    job = drive(make_job(command=TORCHRUN, gpus_per_node=2), JobStatus.RUNNING, timeout=60)
    first = job.attempts.get()
    part = AttemptNode.objects.select_related("node").get(attempt=first)
    if when == "start-up":
        # torchrun is up; its workers are being started or are in the rendezvous.
        wait(agent, lambda: processes_of(job, 1), 60, "torchrun never started a worker")
    else:
        wait(agent, lambda: logged(job, "rank 1 step 3") and logged(job, "rank 0 step 3"), 120, "the workers never trained")
        assert len(processes_of(job, 1)) >= 3  # torchrun and its two workers

    inject_fault(part.node, kind="gpu_lost", gpu=part.gpu_indices[0])
    wait(agent, lambda: JobAttempt.objects.get(pk=first.pk).state == JobAttempt.State.EXITED, 30, "the attempt never ended")
    job = drive(job, JobStatus.RUNNING, timeout=60)

    assert job.failover_count == 1
    assert processes_of(job, 1) == []
    assert AttemptNode.objects.get(attempt__job=job, attempt__number=2).node_id != part.node_id
    wait(agent, lambda: logged(job, "worker 1 of 2 up") and processes_of(job, 2), 60, "the second attempt never trained")
    request_stop(TrainingJob.objects.get(pk=job.pk), actor=job.owner.username)
    drive(job, JobStatus.STOPPED, timeout=60)
    wait(agent, lambda: not processes_of(job, 2), 20, f"the second attempt's processes outlived its stop: {describe(processes_of(job, 2))}")


@pytest.mark.django_db(transaction=True)
def test_a_40_second_database_lock_kills_no_job_and_loses_no_node(nodes, make_job, settings):
    from agent.loop import EmbeddedControlLoop
    from agent.node_agent import NodeAgent

    if connection.vendor != "sqlite":
        pytest.skip("the lock is SQLite's database-wide write lock")
    settings.STOP_GRACE_PERIOD = 5.0
    job = make_job(command="python -c \"import time\nfor i in range(10**6): print('tick', i, flush=True); time.sleep(0.5)\"")
    loop = EmbeddedControlLoop(NodeAgent([n.name for n in nodes]))
    loop.start()
    try:
        deadline = time.monotonic() + 60
        while TrainingJob.objects.get(pk=job.pk).status != JobStatus.RUNNING:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        path = connection.settings_dict["NAME"]
        locker = sqlite3.connect(path, timeout=1, isolation_level=None)
        locker.execute("BEGIN IMMEDIATE")  # the database-wide write lock, as a stuck writer holds it
        held = threading.Event()
        try:
            held.wait(40)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        time.sleep(8)  # the agent and the control round catch up
    finally:
        loop.stop()
        loop.join(30)

    job = TrainingJob.objects.get(pk=job.pk)
    assert job.status == JobStatus.RUNNING and job.failover_count == 0, job.status_reason
    assert job.attempts.count() == 1
    assert not Node.objects.exclude(state=Node.State.READY).exists()
    assert not Node.objects.filter(healthy=False).exists()
    ticks = LogLine.objects.filter(job=job, text__startswith="tick").count()
    assert ticks >= 90  # the run went on during the lock, and its output was stored afterwards
    for part in AttemptNode.objects.filter(attempt__job=job).select_related("attempt"):
        signal_run(part, signal.SIGKILL)
