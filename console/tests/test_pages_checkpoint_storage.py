"""The job page says where a resumed attempt's checkpoint was committed, and warns while a run
commits checkpoints outside the job's work and output directories (lost on a re-placement)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from harness.pages import put_in_status
from jobs.models import JobAttempt
from jobs.statuses import JobStatus
from logs.models import Checkpoint

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
WARNING = "outside the job's work and output directories"


def detail(client, job, **params) -> str:
    response = client.get(reverse("jobs:detail", args=[job.pk]), params)
    assert response.status_code == 200
    return response.content.decode()


def commit(job, attempt: int, step: int, path: str) -> None:
    Checkpoint.objects.create(job=job, attempt=attempt, step=step, path=path, committed_at=T0 + timedelta(seconds=step))


def test_the_failover_tab_names_the_directory_a_resumed_attempt_started_from(login, owner, make_job):
    job = put_in_status(make_job(name="spot"), JobStatus.RUNNING, failover_count=1)
    JobAttempt.objects.create(job=job, number=1, state="exited", started_at=T0, verdict="hardware")
    JobAttempt.objects.create(job=job, number=2, state="running", started_at=T0 + timedelta(minutes=6), resume_step=40)
    for step in (20, 40):
        commit(job, 1, step, f"/job/work/results/concurrent_checkpoint/checkpoint-{step}")
    html = detail(login(owner), job, tab="failover")
    assert 'checkpoint step 40 in <code class="small">/job/work/results/concurrent_checkpoint</code>' in html


def test_a_failed_over_attempt_without_a_checkpoint_says_none_was_found(login, owner, make_job):
    job = put_in_status(make_job(name="fresh"), JobStatus.RUNNING, failover_count=1)
    JobAttempt.objects.create(job=job, number=1, state="exited", started_at=T0, verdict="hardware")
    JobAttempt.objects.create(job=job, number=2, state="running", started_at=T0 + timedelta(minutes=6))
    html = detail(login(owner), job, tab="failover")
    assert "the start: no committed checkpoint in the job's work or output directory" in html


def test_a_running_job_committing_in_the_containers_tmp_is_warned_about(login, owner, make_job):
    job = put_in_status(make_job(name="scratch"), JobStatus.RUNNING)
    JobAttempt.objects.create(job=job, number=1, state="running", started_at=T0)
    commit(job, 1, 10, "/tmp/scratch/concurrent_checkpoint/checkpoint-10")
    html = detail(login(owner), job)
    assert WARNING in html and "/tmp/scratch/concurrent_checkpoint/checkpoint-10</code>" in html
    assert 'data-storage-names="/job/work|' in html


def test_checkpoints_in_the_work_or_output_directory_raise_no_warning(login, owner, make_job):
    job = put_in_status(make_job(name="kept"), JobStatus.RUNNING)
    JobAttempt.objects.create(job=job, number=1, state="running", started_at=T0)
    commit(job, 1, 10, "/tmp/scratch/concurrent_checkpoint/checkpoint-10")
    commit(job, 1, 20, "/job/work/results/concurrent_checkpoint/checkpoint-20")
    client = login(owner)
    assert 'data-checkpoint-warning data-storage-names="/job/work|' in (html := detail(client, job))
    assert "checkpoint-20</code>" not in html and 'data-watch="true" hidden' in html
    commit(job, 1, 30, "/job/output/concurrent_checkpoint/checkpoint-30")
    assert 'data-watch="true" hidden' in detail(client, job)


def test_a_finished_job_is_not_warned_about(login, owner, make_job):
    job = put_in_status(make_job(name="done"), JobStatus.COMPLETED)
    commit(job, 1, 10, "/tmp/scratch/concurrent_checkpoint/checkpoint-10")
    assert 'data-watch="false" hidden' in detail(login(owner), job)


def test_resume_offers_the_newest_checkpoint_a_new_attempt_can_find(login, owner, make_job):
    job = put_in_status(make_job(name="stopped"), JobStatus.STOPPED)
    commit(job, 1, 20, "/job/work/results/concurrent_checkpoint/checkpoint-20")
    commit(job, 1, 30, "/tmp/scratch/concurrent_checkpoint/checkpoint-30")  # lost with the container
    client = login(owner)
    assert "Resume from step 20" in detail(client, job)
    other = put_in_status(make_job(name="only-tmp"), JobStatus.STOPPED)
    commit(other, 1, 30, "/tmp/scratch/concurrent_checkpoint/checkpoint-30")
    assert "Resume from step" not in detail(client, other)
