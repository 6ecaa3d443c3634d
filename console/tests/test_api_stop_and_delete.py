"""Stopping and deleting jobs: what each status allows, and a 409 that says why when it does not."""

from __future__ import annotations

import pytest

from harness.api import job_url, move_to
from jobs.models import JobEvent, TrainingJob
from jobs.statuses import DELETABLE, STOPPABLE, JobStatus

pytestmark = pytest.mark.django_db


def test_stopping_a_pending_job_stops_it_at_once(owner_api, job):
    response = owner_api.post(job_url(job, "stop"))

    assert response.status_code == 200
    assert response.json()["status"] == "Stopped"
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED and job.finished_at is not None
    event = JobEvent.objects.filter(job=job).last()
    assert (event.from_status, event.to_status, event.actor) == ("Pending", "Stopped", "owner")


def test_stopping_a_running_job_asks_its_process_to_stop(owner_api, job):
    move_to(job, JobStatus.RUNNING)

    response = owner_api.post(job_url(job, "stop"))

    assert response.status_code == 200
    assert response.json()["status"] == "Stopping"


def test_stopping_a_completed_job_is_a_409_that_says_why(owner_api, job):
    move_to(job, JobStatus.COMPLETED)

    response = owner_api.post(job_url(job, "stop"))

    assert response.status_code == 409
    assert response.json() == {"detail": "A job that is Completed cannot be stopped."}
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED


@pytest.mark.parametrize("status", sorted(set(JobStatus.values) - STOPPABLE))
def test_a_job_that_cannot_stop_answers_409(owner_api, job, status):
    move_to(job, status)

    assert owner_api.post(job_url(job, "stop")).status_code == 409


def test_stop_ignores_whatever_body_it_is_sent(owner_api, job):
    response = owner_api.post(job_url(job, "stop"), b"not json at all", content_type="application/json")

    assert response.status_code == 200


def test_deleting_a_running_job_is_a_409_and_keeps_it(owner_api, job):
    move_to(job, JobStatus.RUNNING)

    response = owner_api.delete(job_url(job))

    assert response.status_code == 409
    assert "cannot be deleted" in response.json()["detail"]
    assert TrainingJob.objects.filter(pk=job.pk).exists()


@pytest.mark.parametrize("status", sorted(DELETABLE))
def test_deleting_a_finished_job_removes_it(owner_api, job, status):
    move_to(job, status)

    assert owner_api.delete(job_url(job)).status_code == 204
    assert not TrainingJob.objects.filter(pk=job.pk).exists()
    assert owner_api.get(job_url(job)).status_code == 404


@pytest.mark.parametrize("status", sorted(set(JobStatus.values) - DELETABLE))
def test_an_active_job_cannot_be_deleted(owner_api, job, status):
    move_to(job, status)

    assert owner_api.delete(job_url(job)).status_code == 409
