"""A multi-node attempt whose ranks are started by different node agents."""

from __future__ import annotations

import time

import pytest

from agent.node_agent import NodeAgent
from harness.job_factory import job_output
from jobs.models import JobAttempt
from jobs.services.placement import place_waiting_jobs
from jobs.statuses import JobStatus

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def test_a_rank_started_before_its_partner_is_not_stopped_and_the_job_runs_when_all_ranks_are_up(make_job, nodes):
    job = make_job(command="python -c \"import os, time; time.sleep(1.5); print('rank', os.environ['RANK'])\"", node_count=2)
    place_waiting_jobs()
    attempt = JobAttempt.objects.get(job=job)
    first, second = (NodeAgent([name]) for name in ("node-a", "node-b"))
    for _ in range(5):  # node-a's agent starts rank 0 and keeps supervising while node-b's is away
        first.tick()
        time.sleep(0.1)
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert (attempt.state, job.status, attempt.stop_requested_at) == ("placed", JobStatus.PENDING, None)
    second.tick()
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING
    deadline = time.monotonic() + 30
    while job.status != JobStatus.COMPLETED:
        assert time.monotonic() < deadline, job.status_reason
        first.tick()
        second.tick()
        job.refresh_from_db()
        time.sleep(0.1)
    assert sorted((stream, line) for stream in ("master", "worker-1") for line in job_output(job, stream=stream)) == [
        ("master", "rank 0"),
        ("worker-1", "rank 1"),
    ]
