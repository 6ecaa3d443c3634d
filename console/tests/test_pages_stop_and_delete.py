"""Stop and Delete from the detail page: through the lifecycle services, with refusals shown as messages."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.pages import put_in_status, shows
from jobs.models import JobEvent, TrainingJob
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def test_stopping_a_running_job_moves_it_to_stopping(login, owner, make_job):
    job = put_in_status(make_job(name="busy"), JobStatus.RUNNING)
    response = login(owner).post(reverse("jobs:stop", args=[job.pk]), follow=True)
    assert response.redirect_chain == [(reverse("jobs:detail", args=[job.pk]), 302)]
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPING
    assert 'busy is <span data-field="status_text">Stopping</span>.' in response.content.decode()
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.STOPPING, actor="owner").exists()


def test_stopping_a_waiting_job_stops_it_at_once(login, owner, make_job):
    job = make_job()
    login(owner).post(reverse("jobs:stop", args=[job.pk]))
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED


def test_a_teammate_stops_a_job_of_the_shared_project(login, teammate, make_job):
    job = put_in_status(make_job(), JobStatus.RUNNING)
    login(teammate).post(reverse("jobs:stop", args=[job.pk]))
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPING
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.STOPPING, actor="teammate").exists()


def test_stopping_a_finished_job_is_refused_with_a_message(login, owner, make_job):
    job = put_in_status(make_job(), JobStatus.COMPLETED)
    response = login(owner).post(reverse("jobs:stop", args=[job.pk]), follow=True)
    assert response.status_code == 200
    assert shows(response.content.decode(), "A job that is Completed cannot be stopped.")
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED


def test_stop_needs_a_post(login, owner, make_job):
    job = put_in_status(make_job(), JobStatus.RUNNING)
    assert login(owner).get(reverse("jobs:stop", args=[job.pk])).status_code == 405


def test_delete_asks_for_confirmation_first(login, owner, make_job):
    job = put_in_status(make_job(name="old-run"), JobStatus.FAILED)
    html = login(owner).get(reverse("jobs:delete", args=[job.pk])).content.decode()
    assert "Delete old-run?" in html
    assert f'<form method="post" action="{reverse("jobs:delete", args=[job.pk])}"' in html
    assert TrainingJob.objects.filter(pk=job.pk).exists()


def test_deleting_a_finished_job_returns_to_the_list(login, owner, make_job):
    job = put_in_status(make_job(name="old-run"), JobStatus.STOPPED)
    response = login(owner).post(reverse("jobs:delete", args=[job.pk]), follow=True)
    assert response.redirect_chain == [(reverse("jobs:list"), 302)]
    assert "Training Job old-run deleted." in response.content.decode()
    assert not TrainingJob.objects.filter(pk=job.pk).exists()


def test_deleting_an_active_job_is_refused_with_a_message(login, owner, make_job):
    job = put_in_status(make_job(), JobStatus.RUNNING)
    client = login(owner)
    confirm = client.get(reverse("jobs:delete", args=[job.pk])).content.decode()
    assert "cannot be deleted; stop it first." in confirm
    assert 'class="btn btn--danger"' not in confirm
    response = client.post(reverse("jobs:delete", args=[job.pk]), follow=True)
    assert response.status_code == 200
    assert shows(response.content.decode(), "A job that is Running cannot be deleted; stop it first.")
    assert TrainingJob.objects.filter(pk=job.pk).exists()
