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


# What WhiteNoise's table of static files is made from.
TABLE_SETTINGS = (
    "DEBUG", "FORCE_SCRIPT_NAME", "STATIC_URL", "STATIC_ROOT", "STATICFILES_DIRS", "STATICFILES_FINDERS", "WHITENOISE_AUTOREFRESH",
    "WHITENOISE_MAX_AGE", "WHITENOISE_ALLOW_ALL_ORIGINS", "WHITENOISE_CHARSET", "WHITENOISE_MIMETYPES", "WHITENOISE_ADD_HEADERS_FUNCTION",
    "WHITENOISE_INDEX_FILE", "WHITENOISE_IMMUTABLE_FILE_TEST", "WHITENOISE_USE_FINDERS", "WHITENOISE_STATIC_PREFIX",
)  # fmt: skip


@pytest.fixture(autouse=True, scope="session")
def static_files_listed_once():
    """WhiteNoise lists and stats every static file (its finders) each time Django builds a
    middleware chain: once per server process, but once per test client here, ~10 ms each, for
    ~1,000 clients a run. Here the table is built once per test process for the same settings,
    then each new middleware starts from it; what each request is answered with is unchanged."""
    from django.conf import settings
    from whitenoise.middleware import WhiteNoiseMiddleware

    listed: dict[tuple, dict] = {}
    list_files = WhiteNoiseMiddleware.add_files_from_finders

    def add_files_from_finders(self) -> None:
        key = tuple(repr(getattr(settings, name, None)) for name in TABLE_SETTINGS)
        if key not in listed:
            before = dict(self.files)
            list_files(self)
            listed[key] = {url: found for url, found in self.files.items() if before.get(url) is not found}
        self.files.update(listed[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WhiteNoiseMiddleware, "add_files_from_finders", add_files_from_finders)
        yield
