"""Helpers shared by the page and admin tests (a job put in a status, stored log lines, what a
page shows), and ``login``: the test client signed in as a user. The users come from
``harness.accounts``, the job factory from ``harness.job_factory``."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from jobs.models import TrainingJob
from logs.models import LogLine


def put_in_status(job: TrainingJob, status: str, **fields) -> TrainingJob:
    """Test set-up: place a job in a status directly (the transition table has its own tests)."""
    TrainingJob.objects.filter(pk=job.pk).update(status=status, **fields)
    job.refresh_from_db()
    return job


def add_log_lines(job: TrainingJob, count: int, *, stream: str = "master", attempt: int = 1, first_seq: int = 1) -> None:
    start = timezone.now() - timedelta(seconds=count)
    LogLine.objects.bulk_create(
        LogLine(
            job=job,
            stream=stream,
            attempt=attempt,
            seq=first_seq + i,
            line_no=first_seq + i,
            ts=start + timedelta(seconds=i),
            text=f"{stream} line {first_seq + i}",
        )
        for i in range(count)
    )


def field_errors(html: str, field: str) -> str:
    """The error list rendered beside a form field (empty when there is none)."""
    match = re.search(rf'<ul class="errorlist" id="id_{field}_error">(.*?)</ul>', html, re.S)
    return match.group(1) if match else ""


def shows(html: str, text: str) -> bool:
    return escape(text) in html


def listed_job_ids(html: str) -> list[int]:
    return [int(pk) for pk in re.findall(r'<tr data-job-id="(\d+)"', html)]


@pytest.fixture
def login(client: Client) -> Callable[..., Client]:
    def as_user(user) -> Client:
        client.force_login(user)
        return client

    return as_user
