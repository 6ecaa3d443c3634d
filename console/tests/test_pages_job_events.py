"""The Events tab lists a job's status history: time, from → to, reason, attempt and actor."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def test_it_lists_each_status_change_in_order(login, owner, make_job):
    job = make_job()
    transition(job.pk, JobStatus.RUNNING, reason="attempt 1 running on node-a GPU 0", actor="node-agent", attempt=1)
    transition(job.pk, JobStatus.FAILOVER_IN_PROGRESS, reason="GPU 0 fell off the bus", actor="failover", attempt=1)
    html = login(owner).get(reverse("jobs:detail", args=[job.pk]), {"tab": "events"}).content.decode()
    rows = re.findall(r"<tr>\s*<td><time.*?</tr>", html, re.S)
    assert len(rows) == 3
    assert "<strong>Pending</strong>" in rows[0] and "job created" in rows[0] and "owner" in rows[0]
    assert "Pending <span" in rows[1] and "<strong>Running</strong>" in rows[1] and "node-agent" in rows[1]
    assert '<td class="num">1</td>' in rows[1]
    assert "Running <span" in rows[2] and "<strong>Pending - failoverinprogress</strong>" in rows[2]
    assert "GPU 0 fell off the bus" in rows[2]
    assert re.search(r'<time datetime="\d{4}-\d\d-\d\dT', rows[0])
