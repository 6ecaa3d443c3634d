"""Restarting the console (and its agent) while jobs run loses nothing."""

from __future__ import annotations

import os
import signal
import time

import pytest

from agent import runfiles
from agent.loop import embedded_round
from agent.node_agent import NodeAgent, run_dir
from harness.job_factory import job_output
from jobs.models import JobAttempt
from jobs.statuses import JobStatus
from logs.models import LogLine

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

COUNTER = "python -c \"import time\nfor i in range(40):\n    print('line', i, flush=True); time.sleep(0.05)\""


def test_a_new_agent_adopts_running_jobs_and_stores_every_line_once(make_job, drive, nodes, agent):
    job = drive(make_job(command=COUNTER), JobStatus.RUNNING)
    time.sleep(0.5)
    embedded_round(agent)  # some lines stored by the first agent
    stored_before = LogLine.objects.filter(job=job).count()
    # The console restarts: a fresh agent with no memory of offsets or children.
    fresh = NodeAgent([n.name for n in nodes])
    deadline = time.monotonic() + 30
    while job.status != JobStatus.COMPLETED:
        assert time.monotonic() < deadline
        embedded_round(fresh)
        job.refresh_from_db()
        time.sleep(0.1)
    texts = job_output(job)
    assert texts == [f"line {i}" for i in range(40)]
    assert stored_before < 40


def test_a_run_whose_supervisor_died_ends_failed_with_the_reason(make_job, drive, nodes, agent):
    job = make_job(command="python -c \"import time; print('up', flush=True); time.sleep(600)\"", failover_enabled=False)
    job = drive(job, JobStatus.RUNNING)
    part = JobAttempt.objects.get(job=job).placements.get()
    deadline = time.monotonic() + 10
    while not runfiles.pid_written(run_dir(part)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    pgid = runfiles.read_pid(run_dir(part)).pgid
    # The supervisor dies first (so it never records the exit), then its run.
    part.refresh_from_db()
    os.kill(part.runner_pid, signal.SIGKILL)
    agent.launcher.children.pop(part.runner_pid).wait()
    os.killpg(pgid, signal.SIGKILL)
    job = drive(job, JobStatus.FAILED)
    assert job.status_reason == "the run's supervisor process was lost; Job Failover is off"


def test_an_unreadable_output_record_is_skipped_and_the_rest_is_stored(make_job, nodes, agent):
    from jobs.models import AttemptNode
    from jobs.services.placement import place_waiting_jobs

    job = make_job(command="python -c \"print('x')\"")
    place_waiting_jobs()
    part = AttemptNode.objects.get(attempt__job=job)
    directory = run_dir(part)
    directory.mkdir(parents=True)
    (directory / runfiles.OUTPUT_FILE).write_bytes(
        b'{"n": 1, "t": 1764500000.0, "s": "first"}\n{"n": 2, "t": broken\n{"n": 3, "t": 1764500001.0, "s": "third"}\n'
    )
    assert agent.drain(part, directory)
    assert list(LogLine.objects.filter(job=job).order_by("seq").values_list("line_no", "text")) == [(1, "first"), (3, "third")]
