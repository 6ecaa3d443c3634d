"""``manage.py job show|stop|resume <id>``: an operator's terminal does what the Stop and Resume
buttons do, with the same history rows, and says clearly why it cannot."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from harness.pages import put_in_status
from jobs.models import JobEvent
from jobs.statuses import JobStatus
from logs.models import Checkpoint


def job_command(*args: str) -> str:
    out = StringIO()
    call_command("job", *args, stdout=out)
    return out.getvalue()


def latest_event(job) -> JobEvent:
    return JobEvent.objects.filter(job=job).latest("id")


def test_stopping_a_running_job_asks_its_agent_to_stop_it_and_records_who_and_why(make_job):
    job = put_in_status(make_job(name="long-run"), JobStatus.RUNNING)

    assert job_command("stop", str(job.pk), "--reason", "node maintenance") == f"Job {job.pk} (long-run) is Stopping.\n"

    job.refresh_from_db()
    assert (job.status, job.status_reason) == (JobStatus.STOPPING, "node maintenance")
    event = latest_event(job)
    assert (event.from_status, event.to_status, event.reason) == (JobStatus.RUNNING, JobStatus.STOPPING, "node maintenance")
    assert event.actor.endswith("(manage.py job)")


def test_a_waiting_job_stops_at_once(make_job):
    job = make_job(name="queued")
    assert job_command("stop", str(job.pk)) == f"Job {job.pk} (queued) is Stopped.\n"
    job.refresh_from_db()
    assert (job.status, job.status_reason) == (JobStatus.STOPPED, "stopped by an operator")


def test_a_finished_job_cannot_be_stopped_and_a_missing_one_is_named(make_job):
    job = put_in_status(make_job(), JobStatus.COMPLETED)
    with pytest.raises(CommandError, match=r"A job that is Completed cannot be stopped\."):
        job_command("stop", str(job.pk))
    with pytest.raises(CommandError, match=f"No training job with id {job.pk + 1000}."):
        job_command("show", str(job.pk + 1000))


@pytest.mark.parametrize("raw", ["abc", "0", "-3", "1" * 19])
def test_an_id_that_is_not_a_positive_integer_is_refused_before_any_lookup(raw, db):
    with pytest.raises(CommandError, match="is not a job id"):
        job_command("show", raw)


def test_resume_starts_a_stopped_job_again_from_its_last_checkpoint_and_refuses_without_one(make_job):
    job = put_in_status(make_job(name="resumable"), JobStatus.STOPPED, finished_at=timezone.now())
    with pytest.raises(CommandError, match="no committed checkpoint"):
        job_command("resume", str(job.pk))

    Checkpoint.objects.create(job=job, attempt=1, step=40, committed_at=timezone.now())
    assert job_command("resume", str(job.pk)) == f"Job {job.pk} (resumable) resumes from checkpoint step 40; it is Pending.\n"
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING and job.finished_at is None
    assert "from checkpoint step 40" in latest_event(job).reason

    with pytest.raises(CommandError, match="A job that is Pending cannot be resumed"):
        job_command("resume", str(job.pk))


def test_show_prints_the_status_the_reason_and_the_history(make_job):
    job = make_job(name="shown")
    job_command("stop", str(job.pk), "--reason", "not needed")

    text = job_command("show", str(job.pk))
    assert "status:               Stopped" in text
    assert "reason:               not needed" in text
    assert "Pending -> Stopped" in text and "not needed" in text

    document = json.loads(job_command("show", str(job.pk), "--json"))
    assert (document["id"], document["name"], document["status"]) == (job.pk, "shown", "Stopped")
    assert [e["to"] for e in document["events"]] == ["Pending", "Stopped"]
