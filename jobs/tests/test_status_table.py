from __future__ import annotations

import itertools

import pytest

from jobs.models import JobEvent, TrainingJob
from jobs.services.lifecycle import transition
from jobs.statuses import ACTIVE, TERMINAL, TRANSITIONS, JobStatus, can_transition

ALL = list(JobStatus.values)


def test_the_status_texts_are_exactly_the_services():
    assert set(ALL) == {
        "Pending",
        "Running",
        "Pending - failoverinprogress",
        "Pending - internalerror",
        "Pending - maxretriesexceeded",
        "Pending - imagepullbackoff",
        "Completed",
        "Failed",
        "Stopping",
        "Stopped",
    }


def test_every_status_has_a_row_in_the_table_and_groups_partition_them():
    assert set(TRANSITIONS) == set(ALL)
    assert set(ALL) == ACTIVE | TERMINAL
    assert not ACTIVE & TERMINAL


def test_the_documented_flows_are_allowed():
    flows = [
        ["Pending", "Running", "Completed"],
        ["Running", "Pending - failoverinprogress", "Running"],
        ["Running", "Pending - failoverinprogress", "Pending - internalerror"],
        ["Running", "Failed"],
        ["Running", "Stopping", "Stopped"],
        ["Pending", "Pending - imagepullbackoff", "Pending", "Running"],
        ["Running", "Pending", "Running"],
    ]
    for flow in flows:
        for a, b in itertools.pairwise(flow):
            assert can_transition(a, b), f"{a} → {b}"


@pytest.mark.django_db
def test_transition_passes_exactly_the_tables_pairs(make_job):
    job = make_job()
    for from_status, to_status in itertools.product(ALL, ALL):
        TrainingJob.objects.filter(pk=job.pk).update(status=from_status)
        events_before = JobEvent.objects.filter(job=job).count()
        moved = transition(job.pk, to_status, reason="walk", actor="test")
        job.refresh_from_db()
        expected = to_status in TRANSITIONS[from_status]
        assert moved is expected, f"{from_status} → {to_status}"
        assert job.status == (to_status if expected else from_status)
        assert JobEvent.objects.filter(job=job).count() == events_before + (1 if expected else 0)
        if expected:
            event = JobEvent.objects.filter(job=job).latest("id")
            assert (event.from_status, event.to_status, event.actor) == (from_status, to_status, "test")


@pytest.mark.django_db
def test_a_stale_expected_status_loses_the_compare_and_swap(make_job):
    job = make_job()
    assert transition(job.pk, JobStatus.RUNNING, expected={JobStatus.PENDING})
    assert not transition(job.pk, JobStatus.STOPPED, expected={JobStatus.PENDING})
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


@pytest.mark.django_db
def test_entering_a_terminal_status_sets_the_finish_time(make_job):
    job = make_job()
    transition(job.pk, JobStatus.RUNNING)
    transition(job.pk, JobStatus.COMPLETED, reason="exit code 0")
    job.refresh_from_db()
    assert job.finished_at is not None
    assert job.status_reason == "exit code 0"
