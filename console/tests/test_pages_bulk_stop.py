"""Bulk stop from the list: each selected job through request_stop; refusals are messages, never errors."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.pages import put_in_status, shows
from jobs.models import JobEvent
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def bulk_stop(client, *jobs, **extra):
    return client.post(reverse("jobs:bulk"), {"action": "stop", "job_ids": [j.pk for j in jobs], **extra}, follow=True)


def test_it_stops_every_selected_job(login, owner, make_job):
    running = put_in_status(make_job(name="running"), JobStatus.RUNNING)
    waiting = make_job(name="waiting")
    response = bulk_stop(login(owner), running, waiting)
    assert response.status_code == 200
    running.refresh_from_db()
    waiting.refresh_from_db()
    assert running.status == JobStatus.STOPPING
    assert waiting.status == JobStatus.STOPPED
    assert "Stop requested for 2 jobs" in response.content.decode()
    assert JobEvent.objects.filter(job=running, to_status=JobStatus.STOPPING, actor="owner").exists()


def test_a_teammate_stops_jobs_of_the_shared_project(login, teammate, make_job):
    job = put_in_status(make_job(), JobStatus.RUNNING)
    bulk_stop(login(teammate), job)
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPING


def test_a_job_that_cannot_stop_is_reported_and_the_others_still_stop(login, owner, make_job):
    done = put_in_status(make_job(name="already-done"), JobStatus.COMPLETED)
    running = put_in_status(make_job(name="running"), JobStatus.RUNNING)
    response = bulk_stop(login(owner), done, running)
    html = response.content.decode()
    assert response.status_code == 200
    assert shows(html, "already-done: A job that is Completed cannot be stopped.")
    assert "Stop requested for 1 job: running." in html
    done.refresh_from_db()
    running.refresh_from_db()
    assert (done.status, running.status) == (JobStatus.COMPLETED, JobStatus.STOPPING)


def test_jobs_the_user_cannot_see_are_not_stopped(login, outsider, make_job):
    job = put_in_status(make_job(), JobStatus.RUNNING)
    response = bulk_stop(login(outsider), job)
    assert response.status_code == 200
    assert "1 selected job was not found." in response.content.decode()
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_nothing_selected_asks_for_a_selection(login, owner):
    response = bulk_stop(login(owner))
    assert "Select at least one job first." in response.content.decode()


def test_it_returns_to_the_list_with_its_filters(login, owner, make_job):
    job = make_job()
    response = login(owner).post(reverse("jobs:bulk"), {"action": "stop", "job_ids": [job.pk], "next": "/?type=Spot&page_size=50"})
    assert response.status_code == 302
    assert response["Location"] == "/?type=Spot&page_size=50"


def test_it_never_redirects_to_another_site(login, owner, make_job):
    job = make_job()
    response = login(owner).post(reverse("jobs:bulk"), {"action": "stop", "job_ids": [job.pk], "next": "https://evil.example/"})
    assert response["Location"] == reverse("jobs:list")


def test_garbage_ids_and_unknown_actions_are_refused_politely(login, owner, make_job):
    client = login(owner)
    response = client.post(reverse("jobs:bulk"), {"action": "explode", "job_ids": ["1"]}, follow=True)
    assert "Choose Stop or Delete." in response.content.decode()
    response = client.post(reverse("jobs:bulk"), {"action": "stop", "job_ids": ["x", "99999"]}, follow=True)
    assert response.status_code == 200
    assert "1 selected job was not found." in response.content.decode()


def test_bulk_actions_need_a_post(login, owner):
    assert login(owner).get(reverse("jobs:bulk")).status_code == 405


def test_bulk_actions_need_the_csrf_token(owner, make_job):
    from django.test import Client

    job = put_in_status(make_job(), JobStatus.RUNNING)
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post(reverse("jobs:bulk"), {"action": "stop", "job_ids": [job.pk]})
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING


def test_a_live_refresh_racing_the_redirect_leaves_the_message_to_the_page_it_was_for(login, owner, make_job):
    """The open list re-reads itself when a job's status changes; that read can reach the server
    between the POST and its redirect. It must not take the message (a CI run lost it this way)."""
    job = put_in_status(make_job(name="raced"), JobStatus.RUNNING)
    client = login(owner)
    client.post(reverse("jobs:bulk"), {"action": "stop", "job_ids": [job.pk]})
    refresh = client.get(reverse("jobs:list"), headers={"X-Live-Refresh": "1"})
    assert refresh.status_code == 200 and "Stop requested" not in refresh.content.decode()
    page = client.get(reverse("jobs:list"))
    assert "Stop requested for 1 job: raced." in page.content.decode()
