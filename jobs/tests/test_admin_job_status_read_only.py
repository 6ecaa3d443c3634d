"""In the admin a job's status cannot be edited: it moves only through lifecycle.transition."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.pages import put_in_status
from jobs.models import TrainingJob
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db

READ_ONLY = ("status", "status_reason", "started_at", "finished_at", "failover_count")


def change_url(job) -> str:
    return reverse("admin:jobs_trainingjob_change", args=[job.pk])


def test_the_status_fields_are_shown_but_not_editable(login, staff, make_job):
    job = put_in_status(make_job(), JobStatus.RUNNING, status_reason="attempt 1 running")
    response = login(staff).get(change_url(job))
    html = response.content.decode()
    form = response.context["adminform"].form
    for field in READ_ONLY:
        assert field not in form.fields, field
        assert f'name="{field}"' not in html
    assert "attempt 1 running" in html


def test_posting_a_status_does_not_change_it(login, staff, make_job):
    job = put_in_status(make_job(name="steady"), JobStatus.RUNNING)
    client = login(staff)
    form = client.get(change_url(job)).context["adminform"].form
    data = {name: form[name].value() for name in form.fields}
    data.update(
        {
            "failover_enabled": "on" if data["failover_enabled"] else "",
            "env": '{"A": "1"}',
            "status": JobStatus.COMPLETED,
            "failover_count": "3",
            "description": "edited by an operator",
            "max_run_minutes": "",
            "attempts-TOTAL_FORMS": "0",
            "attempts-INITIAL_FORMS": "0",
            "events-TOTAL_FORMS": "0",
            "events-INITIAL_FORMS": "0",
        }
    )
    response = client.post(change_url(job), {k: v for k, v in data.items() if v is not None})
    assert response.status_code == 302, response.context["adminform"].form.errors
    job.refresh_from_db()
    assert (job.status, job.failover_count, job.description) == (JobStatus.RUNNING, 0, "edited by an operator")


def test_jobs_are_not_added_from_the_admin(login, staff):
    assert login(staff).get(reverse("admin:jobs_trainingjob_add")).status_code == 403


def test_an_active_job_cannot_be_deleted_from_the_admin(login, staff, make_job):
    job = put_in_status(make_job(), JobStatus.RUNNING)
    assert login(staff).get(reverse("admin:jobs_trainingjob_delete", args=[job.pk])).status_code == 403
    assert TrainingJob.objects.filter(pk=job.pk).exists()


def test_attempts_and_events_are_records_not_edited(login, staff, make_job):
    job = make_job()
    event = job.events.get()
    html = login(staff).get(reverse("admin:jobs_jobevent_change", args=[event.pk])).content.decode()
    assert 'name="to_status"' not in html
    assert login(staff).get(reverse("admin:jobs_jobevent_add")).status_code == 403
    assert login(staff).get(reverse("admin:jobs_jobattempt_add")).status_code == 403
