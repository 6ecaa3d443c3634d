"""A job's history through the API: its status changes, and where each attempt ran and how it ended."""

from __future__ import annotations

import pytest
from django.utils import timezone

from harness.api import job_url, move_to
from jobs.models import AttemptNode, JobAttempt, Node
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def test_events_list_every_status_change_in_order(owner_api, job):
    move_to(job, JobStatus.COMPLETED)

    events = owner_api.get(job_url(job, "events")).json()

    assert [(e["from_status"], e["to_status"]) for e in events] == [
        ("", "Pending"),
        ("Pending", "Running"),
        ("Running", "Completed"),
    ]
    assert events[0]["actor"] == "owner" and events[0]["reason"] == "job created"
    assert set(events[0]) == {"id", "from_status", "to_status", "reason", "attempt", "actor", "created_at"}


def test_a_job_that_never_ran_has_no_attempts(owner_api, job):
    assert owner_api.get(job_url(job, "attempts")).json() == []


def test_attempts_show_their_nodes_gpus_and_exit(owner_api, job):
    node_a = Node.objects.create(name="node-a")
    node_b = Node.objects.create(name="node-b")
    now = timezone.now()
    first = JobAttempt.objects.create(
        job=job,
        number=1,
        state=JobAttempt.State.EXITED,
        started_at=now,
        ended_at=now,
        exit_code=None,
        exit_signal=9,
        cause="GPU fell off the bus",
    )
    AttemptNode.objects.create(attempt=first, node=node_a, rank=0, gpu_indices=[0, 1])
    second = JobAttempt.objects.create(job=job, number=2, state=JobAttempt.State.RUNNING, started_at=now)
    AttemptNode.objects.create(attempt=second, node=node_b, rank=0, gpu_indices=[2, 3])
    AttemptNode.objects.create(attempt=second, node=node_a, rank=1, gpu_indices=[2, 3])

    attempts = owner_api.get(job_url(job, "attempts")).json()

    assert [a["number"] for a in attempts] == [1, 2]
    assert attempts[0]["state"] == "exited"
    assert attempts[0]["nodes"] == ["node-a"]
    assert attempts[0]["exit_signal"] == 9 and attempts[0]["exit_code"] is None
    assert attempts[0]["cause"] == "GPU fell off the bus"
    assert attempts[1]["nodes"] == ["node-b", "node-a"]
    assert [(p["node"], p["rank"], p["stream"], p["gpu_indices"]) for p in attempts[1]["placements"]] == [
        ("node-b", 0, "master", [2, 3]),
        ("node-a", 1, "worker-1", [2, 3]),
    ]
    assert attempts[1]["ended_at"] is None


def test_the_attempts_of_a_job_take_a_fixed_number_of_queries(owner_api, job, django_assert_max_num_queries):
    node = Node.objects.create(name="node-a")
    for number in range(1, 6):
        attempt = JobAttempt.objects.create(job=job, number=number)
        AttemptNode.objects.create(attempt=attempt, node=node, gpu_indices=[0])

    with django_assert_max_num_queries(4):
        assert len(owner_api.get(job_url(job, "attempts")).json()) == 5
