"""After a failure: every cause links to the log line that tells it (the Attempts table and the
Failover tab say the same), "Clone and fix" quotes that line above the prefilled form, and
"Resume" is offered only for a Stopped / internalerror job with a committed checkpoint."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from harness.pages import put_in_status
from jobs.models import JobAttempt, JobEvent
from jobs.statuses import JobStatus
from logs.models import Checkpoint, LogLine

pytestmark = pytest.mark.django_db


def failed_run(make_job, status=JobStatus.INTERNAL_ERROR):
    job = put_in_status(make_job(name="broken", command="python train.py --lr 10"), status)
    now = timezone.now()
    JobAttempt.objects.create(
        job=job,
        number=1,
        state="exited",
        started_at=now - timedelta(minutes=1),
        ended_at=now,
        exit_code=1,
        cause="exit code 1",
        verdict="non-hardware",
        verdict_reason="user code error: ValueError",
    )
    texts = [
        "Starting dataset initialization",
        "Traceback (most recent call last):",
        '  File "train.py", line 3',
        "ValueError: learning rate 10 is too large",
        "done?",
    ]
    LogLine.objects.bulk_create(LogLine(job=job, stream="master", attempt=1, seq=i, line_no=i, ts=now, text=t) for i, t in enumerate(texts, 1))
    return job


def test_every_cause_links_to_its_log_line_and_both_tabs_agree(login, owner, make_job):
    job = failed_run(make_job)
    client = login(owner)
    details = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    failover = client.get(reverse("jobs:detail", args=[job.pk]) + "?tab=failover").content.decode()
    link = "?tab=logs&amp;stream=master#L4"
    for html in (details, failover):
        assert link in html
        assert "ValueError: learning rate 10 is too large" in html
        assert "user code error: ValueError" in html


def test_clone_and_fix_quotes_the_failing_line_above_the_prefilled_command(login, owner, make_job):
    job = failed_run(make_job)
    client = login(owner)
    detail = client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert 'data-action="clone-fix"' in detail
    html = client.get(reverse("jobs:clone", args=[job.pk]) + "?fix=1").content.decode()
    assert "data-fix-line" in html and "ValueError: learning rate 10 is too large" in html
    assert "python train.py --lr 10" in html


def test_resume_is_offered_only_with_a_committed_checkpoint(login, owner, make_job):
    job = failed_run(make_job, JobStatus.STOPPED)
    client = login(owner)
    assert 'data-action="resume"' not in client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    response = client.post(reverse("jobs:resume", args=[job.pk]), follow=True)
    assert "no committed checkpoint" in response.content.decode()
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED

    Checkpoint.objects.create(job=job, attempt=1, step=40, committed_at=timezone.now())
    assert "Resume from step 40" in client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
    client.post(reverse("jobs:resume", args=[job.pk]))
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING and job.finished_at is None
    event = JobEvent.objects.filter(job=job).latest("id")
    assert (event.from_status, event.to_status) == (JobStatus.STOPPED, JobStatus.PENDING)
    assert "resumed by owner from checkpoint step 40" in event.reason


def test_a_completed_job_cannot_be_resumed(login, owner, make_job):
    job = put_in_status(make_job(), JobStatus.COMPLETED)
    Checkpoint.objects.create(job=job, attempt=1, step=10, committed_at=timezone.now())
    response = login(owner).post(reverse("jobs:resume", args=[job.pk]), follow=True)
    assert "cannot be resumed" in response.content.decode()
    job.refresh_from_db()
    assert job.status == JobStatus.COMPLETED


def test_outsiders_cannot_resume(login, outsider, make_job):
    job = failed_run(make_job, JobStatus.STOPPED)
    Checkpoint.objects.create(job=job, attempt=1, step=10, committed_at=timezone.now())
    assert login(outsider).post(reverse("jobs:resume", args=[job.pk])).status_code == 404
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED


def test_the_api_resumes_a_stopped_job_with_a_checkpoint_and_refuses_one_without(api_as, owner, make_job):
    api = api_as(owner)
    job = failed_run(make_job, JobStatus.STOPPED)
    refused = api.post(f"/api/v1/training-jobs/{job.pk}/resume/")
    assert refused.status_code == 409 and "no committed checkpoint" in refused.json()["detail"]
    Checkpoint.objects.create(job=job, attempt=1, step=30, committed_at=timezone.now())
    response = api.post(f"/api/v1/training-jobs/{job.pk}/resume/")
    assert response.status_code == 200 and response.json()["status"] == "Pending"


def test_a_final_pending_status_says_it_is_final(login, owner, make_job):
    job = failed_run(make_job)
    html = login(owner).get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert "is final, not waiting" in html
    waiting = make_job(name="waiting")
    assert "is final, not waiting" not in login(owner).get(reverse("jobs:detail", args=[waiting.pk])).content.decode()
