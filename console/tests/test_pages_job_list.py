"""The Training Job list shows each job's columns, a status badge told by colour, icon and text, and hooks for live updates."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.urls import reverse
from django.utils import timezone

from harness.pages import put_in_status
from jobs.models import JobAttempt
from jobs.statuses import BADGE_GROUPS, JobStatus

pytestmark = pytest.mark.django_db


def row_of(html: str, job_id: int) -> str:
    match = re.search(rf'<tr data-job-id="{job_id}".*?</tr>', html, re.S)
    assert match, f"no row for job {job_id}"
    return match.group(0)


def test_each_row_shows_the_jobs_columns(login, owner, make_job):
    job = make_job(name="bert-base", gpus_per_node=4, node_count=2, job_type="Spot", image="pytorch:2.13-py3.11")
    job = put_in_status(job, JobStatus.FAILOVER_IN_PROGRESS, failover_count=2)
    row = row_of(login(owner).get(reverse("jobs:list")).content.decode(), job.pk)
    assert f'href="{reverse("jobs:detail", args=[job.pk])}"' in row
    assert "bert-base" in row
    assert "Spot" in row
    assert "pytorch:2.13-py3.11" in row
    assert "4 × 2" in row
    assert "2/3" in row
    assert job.created_at.strftime("%Y-%m-%d") in row


def test_a_row_shows_what_a_job_and_its_user_wrote_as_text_never_as_markup(login, owner, teammate, project, make_job):
    """Rows are written in Python (console_tags.job_list_row): every value is escaped there."""
    from django.contrib.auth.models import User

    User.objects.filter(pk=teammate.pk).update(username='<b onmouseover="x">mallory')
    job = make_job(owner=User.objects.get(pk=teammate.pk), project=project)
    reason = '<script>alert(1)</script> & "quoted" ' + "x" * 80
    put_in_status(job, JobStatus.INTERNAL_ERROR, status_reason=reason)
    row = row_of(login(owner).get(reverse("jobs:list")).content.decode(), job.pk)
    assert "<script>" not in row and "<b " not in row
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;quoted&quot;" in row  # title: whole; text: cut at 70
    assert "&lt;b onmouseover=&quot;x&quot;&gt;mallory" in row
    assert row.count("…") == 1


@pytest.mark.parametrize("status", JobStatus.values)
def test_the_status_badge_carries_colour_icon_and_text_for_every_status(login, owner, make_job, status):
    job = put_in_status(make_job(), status)
    group, icon = BADGE_GROUPS[status]
    row = row_of(login(owner).get(reverse("jobs:list")).content.decode(), job.pk)
    badge = re.search(r'<span class="badge [^"]*".*?</span></span>', row, re.S).group(0)
    assert f"badge--{group}" in badge
    assert f'href="#icon-{icon}"' in badge
    assert f'<span class="badge__text">{status}</span>' in badge
    assert 'data-field="status"' in badge


def test_rows_and_cells_have_stable_hooks_for_live_updates(login, owner, make_job):
    job = make_job()
    row = row_of(login(owner).get(reverse("jobs:list")).content.decode(), job.pk)
    for field in ("status", "failover_count", "running_time"):
        assert f'data-field="{field}"' in row


def test_running_time_is_shown_from_the_attempts_start_and_end(login, owner, make_job):
    with time_machine.travel(timezone.now(), tick=False):
        started = timezone.now() - timedelta(minutes=3, seconds=4)
        running = put_in_status(make_job(name="running"), JobStatus.RUNNING, started_at=started)
        JobAttempt.objects.create(job=running, number=1, state="running", started_at=started)
        start, end = timezone.now() - timedelta(hours=3), timezone.now() - timedelta(hours=1, minutes=58, seconds=59)
        finished = put_in_status(make_job(name="finished"), JobStatus.COMPLETED, started_at=start, finished_at=end)
        JobAttempt.objects.create(job=finished, number=1, state="exited", started_at=start, ended_at=end)
        waiting = make_job(name="waiting")
        html = login(owner).get(reverse("jobs:list")).content.decode()
    assert "3m 04s" in row_of(html, running.pk)
    assert "1h 01m 01s" in row_of(html, finished.pk)
    assert '<td class="num" data-field="running_time" data-label="Running time">—</td>' in row_of(html, waiting.pk)


def test_a_teammates_job_names_its_owner(login, owner, teammate, make_job):
    job = make_job(owner=owner)
    row = row_of(login(teammate).get(reverse("jobs:list")).content.decode(), job.pk)
    assert "owner" in row


def test_an_empty_list_offers_to_create_a_job(login, owner):
    html = login(owner).get(reverse("jobs:list")).content.decode()
    assert "You have no Training Jobs yet." in html
    assert reverse("jobs:create") in html


def test_every_job_has_a_labelled_checkbox_for_bulk_actions(login, owner, make_job):
    job = make_job(name="labelled")
    html = login(owner).get(reverse("jobs:list")).content.decode()
    assert f'name="job_ids" value="{job.pk}"' in html
    assert 'aria-label="Select labelled"' in html
    assert 'name="csrfmiddlewaretoken"' in html


def test_the_lists_own_name_in_the_address_finds_it(login, owner):
    response = login(owner).get("/training-jobs/?status=Running")
    assert response.status_code == 302 and response["Location"] == "/?status=Running"
