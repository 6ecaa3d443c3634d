"""The job detail page: header with status and actions, server-side tabs, and the Details tab with attempts."""

from __future__ import annotations

import re
import signal

import pytest
from django.urls import reverse

from failover.tests.exits import report_exit
from harness.pages import put_in_status, shows
from jobs.backends.facts import Ended, EndKind
from jobs.models import JobAttempt
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import run_started
from jobs.statuses import BADGE_GROUPS, DELETABLE, STOPPABLE, JobStatus

pytestmark = pytest.mark.django_db


def detail(client, job, **params):
    response = client.get(reverse("jobs:detail", args=[job.pk]), params)
    assert response.status_code == 200
    return response.content.decode()


def test_the_header_shows_name_status_badge_and_reason(login, owner, make_job):
    job = put_in_status(make_job(name="resnet"), JobStatus.INTERNAL_ERROR, status_reason="exit code 1: no hardware fault")
    html = detail(login(owner), job)
    header = re.search(r'<div class="page-header job-header" data-job-id="(\d+)".*?<nav class="tabs"', html, re.S)
    assert header and header.group(1) == str(job.pk)
    assert "<h1>resnet</h1>" in header.group(0)
    assert f"badge--{BADGE_GROUPS[JobStatus.INTERNAL_ERROR][0]}" in header.group(0)
    assert "Pending - internalerror" in header.group(0)
    assert '<span class="muted" data-field="status_reason">exit code 1: no hardware fault</span>' in header.group(0)


@pytest.mark.parametrize("status", JobStatus.values)
def test_stop_is_offered_only_while_the_job_can_stop_and_delete_only_once_finished(login, owner, make_job, status):
    job = put_in_status(make_job(), status)
    html = detail(login(owner), job)
    assert (f'action="{reverse("jobs:stop", args=[job.pk])}"' in html) is (status in STOPPABLE)
    assert (f'href="{reverse("jobs:delete", args=[job.pk])}"' in html) is (status in DELETABLE)
    assert f'href="{reverse("jobs:clone", args=[job.pk])}"' in html


def test_tabs_are_links_that_work_without_javascript(login, owner, make_job):
    job = make_job()
    client = login(owner)
    assert '<a href="?tab=details" class="tabs__tab is-active" aria-current="page">Details</a>' in detail(client, job)
    assert '<a href="?tab=logs" class="tabs__tab is-active" aria-current="page">Logs</a>' in detail(client, job, tab="logs")
    assert '<a href="?tab=events" class="tabs__tab is-active" aria-current="page">Events</a>' in detail(client, job, tab="events")
    assert 'aria-current="page">Details</a>' in detail(client, job, tab="bogus")


def test_the_details_tab_shows_every_setting(login, owner, make_job, data_volume):
    job = make_job(
        name="gpt-small",
        job_type="Spot",
        command="deepspeed --num_gpus=2 train.py",
        env={"SEED": "1"},
        gpus_per_node=2,
        node_count=3,
        failover_enabled=False,
        output_dir="/data/gpt",
        max_run_minutes=45,
        description="a small GPT",
    )
    html = detail(login(owner), job)
    for text in ("gpt-small", "Spot", "deepspeed --num_gpus=2 train.py", "SEED=1", "/data/gpt", "45 min", "a small GPT", "owner-personal"):
        assert shows(html, text), text
    assert '<dt>Total GPUs</dt><dd data-field="total_gpus">6</dd>' in html
    assert "<dt>Job Failover</dt><dd>Off</dd>" in html
    assert '<dd data-field="failover_count">0/3</dd>' in html


def test_the_details_tab_lists_each_attempt_with_its_nodes_gpus_and_exit(login, owner, make_job, nodes):
    job = make_job(gpus_per_node=2)
    place_waiting_jobs()
    first = JobAttempt.objects.get(job=job)
    run_started(first)
    report_exit(
        first, exit_code=None, exit_signal=signal.SIGKILL, fact=Ended(EndKind.HUNG_AFTER_KILL, exit_signal=signal.SIGKILL, detail="GPU fell off the bus")
    )
    html = detail(login(owner), job)
    row = re.search(r'<tr data-attempt="1">.*?</tr>', html, re.S).group(0)
    assert "node-a" in row
    assert "node-a: 0,1" in row
    assert "SIGKILL (9)" in row
    assert "GPU fell off the bus" in row
    assert "exited" in row


def test_a_job_without_attempts_says_it_was_not_placed_yet(login, owner, make_job):
    assert "No attempts yet" in detail(login(owner), make_job())


def test_an_unknown_job_is_not_found(login, owner):
    response = login(owner).get(reverse("jobs:detail", args=[424242]))
    assert response.status_code == 404


def test_the_failover_tab_shows_the_node_health_events_of_each_attempt(login, owner, make_job, nodes):
    from datetime import timedelta

    from django.utils import timezone

    from failover.models import HealthEvent

    job = make_job(name="bert")
    [attempt] = [a for a in place_waiting_jobs() if a.job_id == job.pk]
    part = attempt.placements.select_related("node").get()
    gpu = part.gpu_indices[0]
    at = timezone.now()
    HealthEvent.objects.create(node=part.node, gpu=gpu, kind="gpu_lost", source="nvml", message="NVML: GPU is lost", fatal=True, at=at)
    HealthEvent.objects.create(node=part.node, gpu=gpu, kind="xid", xid=13, source="nvml", message="old", at=attempt.created_at - timedelta(hours=1))
    HealthEvent.objects.create(node=part.node, gpu=gpu + 1, kind="xid", xid=48, source="nvml", message="another GPU's", at=at)

    html = detail(login(owner), job, tab="failover")

    events = html[html.index('data-field="health-events"') :]
    events = events[: events.index("</details>")]
    assert "Node health events (1)" in events
    assert f"{part.node.name} GPU {gpu}: gpu_lost (run stopped)" in events and "NVML: GPU is lost" in events
    assert "old" not in events and "another GPU" not in events
