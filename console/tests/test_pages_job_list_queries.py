"""The list runs the same number of queries whatever the page size: no query per row."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from harness.pages import listed_job_ids, put_in_status
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def queries_for(client, **params) -> tuple[int, int]:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(reverse("jobs:list"), params)
    assert response.status_code == 200
    return len(captured), len(listed_job_ids(response.content.decode()))


@pytest.mark.parametrize("who", ["owner", "teammate", "staff"])
def test_the_list_runs_as_many_queries_for_100_rows_as_for_20(request, login, owner, teammate, project, make_job, who):
    started = timezone.now() - timedelta(minutes=5)
    for n in range(110):
        job = make_job(name=f"job-{n:03d}", owner=teammate if n % 3 == 0 else owner, project=project)
        if n % 2:
            put_in_status(job, JobStatus.RUNNING, started_at=started, failover_count=n % 4)
    client = login(request.getfixturevalue(who))
    client.get(reverse("jobs:list"))  # the session and the user are cached by the first request's login

    small, small_rows = queries_for(client, page_size=20)
    large, large_rows = queries_for(client, page_size=100)
    assert (small_rows, large_rows) == (20, 100)
    assert small == large
    assert large <= 7  # 6, and one for the user's projects' GPU usage line
