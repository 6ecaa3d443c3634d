"""A waiting job's place and start estimate, from what holds the GPUs: a running job's progress
(steps left at its rate) or its maximum run time; the jobs ahead in its line take GPUs first; a
job holding GPUs for an unknown time gives no estimate, said as such. Shown in the API (list and
detail), on the job's page and in ``satrain jobs list``."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from agent.inventory import register_nodes, simulated_nodes
from console.estimate import estimate
from jobs.models import GPU, AttemptNode, JobAttempt, Node, TrainingJob
from jobs.services.lifecycle import record_reason, transition
from jobs.statuses import JobStatus
from logs.models import JobProgress
from satrain.cli import starts

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def frozen_clock(monkeypatch):
    """One instant for the whole test: the estimates' seconds are read against the attempts'
    start times, and a loaded machine may take seconds between the two."""
    instant = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: instant)
    return instant


@pytest.fixture
def two_nodes(settings):
    settings.SIMULATED_NODES, settings.SIMULATED_GPUS_PER_NODE = 2, 4
    return register_nodes(simulated_nodes(), agent="embedded")


def hold(job, node, *, ran: float, max_run_minutes: int | None = None) -> JobAttempt:
    """``job`` holds all of ``node``'s GPUs in an attempt started ``ran`` seconds ago."""
    attempt = JobAttempt.objects.create(job=job, number=1, state=JobAttempt.State.RUNNING, started_at=timezone.now() - timedelta(seconds=ran))
    part = AttemptNode.objects.create(attempt=attempt, node=node, gpu_indices=[0, 1, 2, 3])
    GPU.objects.filter(node=node).update(allocated_to=part)
    transition(job.pk, JobStatus.RUNNING, reason="running on " + node.name)
    return attempt


def waiting(make_job, name: str, place: int, gpus: int = 4):
    job = make_job(name=name, gpus_per_node=gpus)
    record_reason(
        job.pk, reason=f"{place}{['st', 'nd', 'rd'][place - 1] if place <= 3 else 'th'} for {gpus} GPUs; waiting for GPUs", expected={JobStatus.PENDING}
    )
    job.refresh_from_db()
    return job


def test_the_next_job_starts_when_the_running_jobs_progress_says_it_ends(make_job, two_nodes, login, owner, owner_api):
    half_done = make_job(name="half-done")
    hold(half_done, two_nodes[0], ran=100)
    JobProgress.objects.create(job=half_done, step=50, total=100, updated_at=timezone.now())
    limited = make_job(name="limited", max_run_minutes=10)
    hold(limited, two_nodes[1], ran=60)

    first = waiting(make_job, "first", 1)
    found = estimate(first)
    assert found.place == 1 and 95 <= found.seconds <= 105
    assert found.text.startswith("It may start in about 2 minutes (first in line for its shape)")
    # The second in line waits for the first to take half-done's node, then for limited's (10 min − 1 min).
    second = waiting(make_job, "second", 2)
    found = estimate(second)
    assert found.place == 2 and 535 <= found.seconds <= 545 and "in about 9 minutes (1 job of its shape ahead)" in found.text
    # A third: the jobs ahead then hold the GPUs, for as long as they will run.
    third = waiting(make_job, "third", 3)
    assert estimate(third).seconds is None and "No estimate (2 jobs of its shape ahead): the jobs ahead of it take the GPUs" in estimate(third).text

    listed = {job["name"]: job["queue"] for job in owner_api.get("/api/v1/training-jobs/").json()["results"]}
    assert listed["second"]["place"] == 2 and 535 <= listed["second"]["seconds"] <= 545 and listed["half-done"] is None
    assert owner_api.get(f"/api/v1/training-jobs/{first.pk}/").json()["queue"]["place"] == 1
    page = login(owner).get(reverse("jobs:detail", args=[second.pk])).content.decode()
    assert 'data-queue-estimate data-place="2"' in page and "in about 9 minutes" in page
    assert starts(listed["second"]) == "2nd, ~9 min" and starts(listed["third"]) == "3rd, no estimate" and starts(None) == ""

    # A job that holds GPUs with neither progress nor a limit: no estimate, and why.
    JobProgress.objects.filter(job=half_done).update(total=None)
    assert 535 <= estimate(first).seconds <= 545  # then limited's node
    TrainingJob.objects.filter(pk=limited.pk).update(max_run_minutes=None)
    assert "No estimate (first in line for its shape): 8 GPUs are held by jobs with no progress total or maximum run time" in estimate(first).text


def test_a_job_that_fits_now_says_so(make_job, two_nodes):
    job = waiting(make_job, "fits", 1, gpus=2)
    assert estimate(job).seconds == 0 and estimate(job).text.startswith("It fits now")


def test_gpus_freed_on_a_cordoned_node_are_not_counted(make_job, two_nodes):
    ending = make_job(name="ending", max_run_minutes=2)
    hold(ending, two_nodes[0], ran=60)
    hold(make_job(name="forever"), two_nodes[1], ran=60)
    job = waiting(make_job, "next", 1)
    assert 55 <= estimate(job).seconds <= 65
    Node.objects.filter(pk=two_nodes[0].pk).update(cordoned=True)
    assert estimate(job).seconds is None
