"""Fixtures and helpers of the REST API tests: API clients (``api_as``, ``owner_api``), a job,
the API's URLs and ``move_to`` (a job walked into a status). Test modules import the helpers from
here and get the fixtures by name.

The users (owner, teammate, outsider, staff) come from ``harness.accounts``, ``make_job`` and
``default_image`` from ``harness.job_factory``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from jobs.models import TrainingJob
from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus

JOBS_URL = "/api/v1/training-jobs/"
NODES_URL = "/api/v1/nodes/"
TOKEN_URL = "/api/v1/auth/token/"

# The shortest way into each status from Pending, through the transition table.
PATHS: dict[str, tuple[str, ...]] = {
    JobStatus.PENDING: (),
    JobStatus.RUNNING: (JobStatus.RUNNING,),
    JobStatus.STOPPING: (JobStatus.RUNNING, JobStatus.STOPPING),
    JobStatus.STOPPED: (JobStatus.STOPPED,),
    JobStatus.COMPLETED: (JobStatus.RUNNING, JobStatus.COMPLETED),
    JobStatus.FAILED: (JobStatus.RUNNING, JobStatus.FAILED),
    JobStatus.IMAGE_PULL_BACKOFF: (JobStatus.IMAGE_PULL_BACKOFF,),
    JobStatus.FAILOVER_IN_PROGRESS: (JobStatus.RUNNING, JobStatus.FAILOVER_IN_PROGRESS),
    JobStatus.INTERNAL_ERROR: (JobStatus.RUNNING, JobStatus.FAILOVER_IN_PROGRESS, JobStatus.INTERNAL_ERROR),
    JobStatus.MAX_RETRIES_EXCEEDED: (JobStatus.RUNNING, JobStatus.FAILOVER_IN_PROGRESS, JobStatus.MAX_RETRIES_EXCEEDED),
}


def job_url(job: TrainingJob, action: str = "") -> str:
    return f"{JOBS_URL}{job.pk}/{action + '/' if action else ''}"


def move_to(job: TrainingJob, status: str) -> TrainingJob:
    """Walk ``job`` into ``status`` through the transition table, as the platform would."""
    for step in PATHS[status]:
        assert transition(job.pk, step, reason="test"), f"{job.status} → {step} refused"
    job.refresh_from_db()
    return job


@pytest.fixture
def api_as() -> Callable[[User | None], APIClient]:
    """An API client signed in as the given user (or anonymous for None)."""

    def client(user: User | None) -> APIClient:
        api = APIClient()
        if user is not None:
            api.force_authenticate(user)
        return api

    return client


@pytest.fixture
def owner_api(api_as, owner) -> APIClient:
    return api_as(owner)


@pytest.fixture
def job(make_job) -> TrainingJob:
    return make_job(name="bert-finetune")
