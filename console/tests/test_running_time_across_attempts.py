"""A job's running time is what its attempts ran: the list, the detail page, the API and the live
snapshot show the sum over its attempts, never the wall time since it first started, and the
figure stands still while the job waits between attempts (a failover)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from harness.pages import listed_job_ids, put_in_status
from jobs.models import JobAttempt
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
EXITED, RUNNING = JobAttempt.State.EXITED, JobAttempt.State.RUNNING


def attempt(job, number: int, start: datetime, end: datetime | None) -> JobAttempt:
    return JobAttempt.objects.create(job=job, number=number, state=EXITED if end else RUNNING, created_at=start, started_at=start, ended_at=end)


@pytest.fixture
def two_attempts(make_job):
    """Ran 10 min, waited 4 min 30 s in failover, ran 5 min 30 s more, completed: 15 min 30 s of running."""
    job = put_in_status(make_job(name="two-attempts"), JobStatus.COMPLETED, started_at=T0, finished_at=T0 + timedelta(minutes=20), failover_count=1)
    attempt(job, 1, T0, T0 + timedelta(minutes=10))
    attempt(job, 2, T0 + timedelta(minutes=14, seconds=30), T0 + timedelta(minutes=20))
    return job


@pytest.fixture
def in_failover(make_job):
    """Its first attempt ran 7 min and ended at T0 + 7 min; it waits in failover since."""
    job = put_in_status(make_job(name="waits"), JobStatus.FAILOVER_IN_PROGRESS, started_at=T0, failover_count=1)
    attempt(job, 1, T0, T0 + timedelta(minutes=7))
    return job


def cell(html: str, job_id: int) -> str:
    row = re.search(rf'<tr data-job-id="{job_id}".*?</tr>', html, re.S)
    assert row, f"no row for job {job_id}"
    found = re.search(r'<td class="num" data-field="running_time"[^>]*>[^<]*</td>', row.group(0))
    assert found
    return found.group(0)


def shown(element: str) -> str:
    return element.rpartition("</")[0].rpartition(">")[2]


def detail_figures(html: str) -> list[str]:
    """The running time of the header and of the Details tab."""
    return [shown(m) for m in re.findall(r'<dd data-field="running_time"[^>]*>[^<]*</dd>', html)]


def test_the_list_detail_page_and_api_show_the_sum_of_the_attempts_not_the_wall_time(login, owner, api_as, two_attempts):
    client = login(owner)
    with time_machine.travel(T0 + timedelta(hours=3), tick=False):
        listed = client.get(reverse("jobs:list")).content.decode()
        detail = client.get(reverse("jobs:detail", args=[two_attempts.pk])).content.decode()
        api = api_as(owner).get(f"/api/v1/training-jobs/{two_attempts.pk}/").json()
        api_list = api_as(owner).get("/api/v1/training-jobs/").json()["results"]
    assert shown(cell(listed, two_attempts.pk)) == "15m 30s"  # not the 20 min from first start to finish
    assert detail_figures(detail) == ["15m 30s", "15m 30s"]
    assert api["running_time_seconds"] == 930
    assert [j["running_time_seconds"] for j in api_list if j["id"] == two_attempts.pk] == [930]


def test_a_job_waiting_in_failover_shows_a_figure_that_does_not_grow(login, owner, api_as, in_failover):
    api, client = api_as(owner), login(owner)
    url = f"/api/v1/training-jobs/{in_failover.pk}/"
    with time_machine.travel(T0 + timedelta(minutes=8), tick=False):
        first = api.get(url).json()["running_time_seconds"]
        first_cell = cell(client.get(reverse("jobs:list")).content.decode(), in_failover.pk)
    with time_machine.travel(T0 + timedelta(minutes=12, seconds=30), tick=False):
        later = api.get(url).json()["running_time_seconds"]
        later_cell = cell(client.get(reverse("jobs:list")).content.decode(), in_failover.pk)
        detail = client.get(reverse("jobs:detail", args=[in_failover.pk])).content.decode()
        live = client.get(reverse("jobs:live"), {"ids": str(in_failover.pk)}).json()["jobs"][0]
    assert first == later == 420
    assert shown(first_cell) == shown(later_cell) == "7m 00s"
    assert detail_figures(detail) == ["7m 00s", "7m 00s"]
    # The page's clock has nothing to count from: it shows the server's figure and stands still.
    assert 'data-ran-seconds="420.000"' in later_cell and "data-running-since" not in later_cell
    assert "data-running-since" not in detail
    assert (live["ran_seconds"], live["running_since"]) == (420.0, None)


def test_it_counts_again_once_the_next_attempt_runs(login, owner, api_as, in_failover):
    second_start = T0 + timedelta(minutes=11, seconds=30)
    attempt(in_failover, 2, second_start, None)
    job = put_in_status(in_failover, JobStatus.RUNNING)
    api, client = api_as(owner), login(owner)
    with time_machine.travel(second_start + timedelta(minutes=1), tick=False):
        at_one_minute = api.get(f"/api/v1/training-jobs/{job.pk}/").json()["running_time_seconds"]
        listed = cell(client.get(reverse("jobs:list")).content.decode(), job.pk)
        live = client.get(reverse("jobs:live"), {"ids": str(job.pk)}).json()["jobs"][0]
    with time_machine.travel(second_start + timedelta(minutes=3), tick=False):
        at_three_minutes = api.get(f"/api/v1/training-jobs/{job.pk}/").json()["running_time_seconds"]
    assert (at_one_minute, at_three_minutes) == (480, 600)
    assert shown(listed) == "8m 00s"
    # The page counts on from the second attempt's start, on top of what the first one ran.
    assert 'data-ran-seconds="420.000"' in listed and f'data-running-since="{second_start.isoformat()}"' in listed
    assert live["ran_seconds"] == 420.0 and live["running_since"] == second_start.isoformat()


def test_a_job_that_never_ran_shows_no_running_time(login, owner, api_as, make_job):
    job = make_job(name="never-ran")
    JobAttempt.objects.create(job=job, number=1, state=JobAttempt.State.ABANDONED, ended_at=T0)
    listed = cell(login(owner).get(reverse("jobs:list")).content.decode(), job.pk)
    assert shown(listed) == "—" and "data-ran-seconds" not in listed
    assert api_as(owner).get(f"/api/v1/training-jobs/{job.pk}/").json()["running_time_seconds"] is None


def test_the_list_reads_running_times_without_a_query_per_row(login, owner, make_job):
    for n in range(55):
        job = put_in_status(make_job(name=f"ran-{n:02d}"), JobStatus.RUNNING, started_at=T0)
        attempt(job, 1, T0, T0 + timedelta(minutes=1))
        attempt(job, 2, T0 + timedelta(minutes=2), None)
    client = login(owner)
    client.get(reverse("jobs:list"))  # the session and the user are cached by the first request's login
    counts = []
    for size in (20, 50):
        with CaptureQueriesContext(connection) as captured:
            html = client.get(reverse("jobs:list"), {"page_size": size}).content.decode()
        assert len(listed_job_ids(html)) == size
        counts.append(len(captured))
    assert counts[0] == counts[1]
