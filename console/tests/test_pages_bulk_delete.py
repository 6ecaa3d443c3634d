"""Bulk delete from the list: a confirmation page first, then each finished job through delete_job."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.pages import put_in_status, shows
from jobs.models import TrainingJob
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def bulk_delete(client, *jobs, confirmed: bool = True, follow: bool = True):
    data = {"action": "delete", "job_ids": [j.pk for j in jobs]}
    if confirmed:
        data["confirmed"] = "yes"
    return client.post(reverse("jobs:bulk"), data, follow=follow)


def test_it_asks_for_confirmation_before_deleting(login, owner, make_job):
    done = put_in_status(make_job(name="done"), JobStatus.COMPLETED)
    running = put_in_status(make_job(name="busy"), JobStatus.RUNNING)
    response = bulk_delete(login(owner), done, running, confirmed=False)
    html = response.content.decode()
    assert response.status_code == 200
    assert "Delete 1 Training Job?" in html
    assert "not finished, will be kept" in html
    assert f'name="job_ids" value="{done.pk}"' in html
    assert f'name="job_ids" value="{running.pk}"' not in html
    assert TrainingJob.objects.count() == 2


def test_it_deletes_the_selected_finished_jobs(login, owner, make_job):
    jobs = [put_in_status(make_job(), status) for status in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.STOPPED)]
    response = bulk_delete(login(owner), *jobs)
    assert response.status_code == 200
    assert "Deleted 3 jobs" in response.content.decode()
    assert not TrainingJob.objects.exists()


def test_an_active_job_is_refused_and_kept(login, owner, make_job):
    done = put_in_status(make_job(name="done"), JobStatus.COMPLETED)
    running = put_in_status(make_job(name="busy"), JobStatus.RUNNING)
    response = bulk_delete(login(owner), done, running)
    html = response.content.decode()
    assert response.status_code == 200
    assert shows(html, "busy: A job that is Running cannot be deleted; stop it first.")
    assert "Deleted 1 job: done." in html
    assert list(TrainingJob.objects.values_list("name", flat=True)) == ["busy"]


def test_nothing_deletable_says_so_on_the_confirmation_page(login, owner, make_job):
    running = put_in_status(make_job(), JobStatus.RUNNING)
    html = bulk_delete(login(owner), running, confirmed=False).content.decode()
    assert "None of the selected jobs can be deleted" in html


def test_jobs_the_user_cannot_see_are_not_deleted(login, outsider, make_job):
    job = put_in_status(make_job(), JobStatus.COMPLETED)
    response = bulk_delete(login(outsider), job)
    assert "1 selected job was not found." in response.content.decode()
    assert TrainingJob.objects.filter(pk=job.pk).exists()


def test_a_teammate_deletes_finished_jobs_of_the_shared_project(login, teammate, make_job):
    job = put_in_status(make_job(), JobStatus.FAILED)
    bulk_delete(login(teammate), job)
    assert not TrainingJob.objects.filter(pk=job.pk).exists()
