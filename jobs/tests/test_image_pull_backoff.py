from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import GPU, Image, JobAttempt, JobEvent, TrainingJob
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def test_an_unknown_image_backs_off_with_the_reason_and_runs_once_the_image_exists(make_job, drive, settings):
    settings.IMAGE_PULL_BACKOFF_BASE = 0.2
    job = make_job(image="team/trainer:v2")
    job = drive(job, JobStatus.IMAGE_PULL_BACKOFF)
    event = JobEvent.objects.get(job=job, to_status=JobStatus.IMAGE_PULL_BACKOFF)
    assert event.reason.startswith("image team/trainer:v2 is not registered; retry 1 in 0s")
    assert job.next_retry_at is not None

    Image.objects.create(reference="team/trainer:v2", runtime=settings.DEFAULT_IMAGE_RUNTIME)
    job = drive(job, JobStatus.COMPLETED, timeout=60)
    assert list(JobEvent.objects.filter(job=job).status_changes().values_list("to_status", flat=True)) == [
        "Pending",
        "Pending - imagepullbackoff",
        "Pending",
        "Running",
        "Completed",
    ]


def test_retries_back_off_exponentially_up_to_the_cap(make_job, nodes, settings):
    from jobs.services.placement import place_waiting_jobs

    settings.IMAGE_PULL_BACKOFF_BASE = 10
    settings.IMAGE_PULL_BACKOFF_MAX = 30
    job = make_job(image="nope:1")
    delays = []
    for _ in range(4):
        TrainingJob.objects.filter(pk=job.pk).update(next_retry_at=timezone.now() - timedelta(seconds=1))
        place_waiting_jobs()
        job.refresh_from_db()
        delays.append(round((job.next_retry_at - timezone.now()).total_seconds()))
    assert delays == [10, 20, 30, 30]
    assert job.pull_attempts == 4
    assert JobEvent.objects.filter(job=job, to_status=JobStatus.IMAGE_PULL_BACKOFF).status_changes().count() == 1
    # Each later retry is in the history too, with its reason.
    assert JobEvent.objects.filter(job=job, from_status=JobStatus.IMAGE_PULL_BACKOFF, to_status=JobStatus.IMAGE_PULL_BACKOFF).count() == 3


def test_an_image_whose_runtime_is_missing_on_the_node_backs_off_and_frees_the_gpus(make_job, drive, tmp_path):
    Image.objects.create(reference="broken:1", runtime=str(tmp_path / "no-such-env"))
    job = drive(make_job(image="broken:1", gpus_per_node=2), JobStatus.IMAGE_PULL_BACKOFF)
    assert "cannot be resolved on the node" in job.status_reason
    assert JobAttempt.objects.get(job=job).state == JobAttempt.State.ABANDONED
    assert not GPU.objects.filter(allocated_to__isnull=False).exists()
