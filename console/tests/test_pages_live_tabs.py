"""The detail page's Checkpoints and Failover tabs, progress and loss curve, and the catch-up fetch."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.urls import reverse

from harness.pages import add_log_lines, put_in_status, shows
from jobs.models import AttemptNode, JobAttempt, JobEvent, Node
from jobs.statuses import JobStatus
from logs.models import Checkpoint, JobProgress, LogLine, MetricPoint

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def detail(client, job, **params) -> str:
    response = client.get(reverse("jobs:detail", args=[job.pk]), params)
    assert response.status_code == 200
    return response.content.decode()


@pytest.fixture
def trained(make_job):
    job = put_in_status(make_job(name="bert"), JobStatus.RUNNING, started_at=T0)
    JobProgress.objects.create(job=job, step=50, total=200, epoch=1.0, loss=0.25, lr=0.001, updated_at=T0)
    MetricPoint.objects.bulk_create(MetricPoint(job=job, step=s, loss=1 / s, ts=T0) for s in range(1, 51))
    return job


def test_the_list_and_header_show_progress(login, owner, trained):
    client = login(owner)
    html = client.get(reverse("jobs:list")).content.decode()
    assert '<progress max="100" value="25" aria-label="Training progress of bert">25%</progress>' in html
    assert "25% · step 50/200 · epoch 1 · loss 0.25 · lr 0.001" in html
    page = detail(client, trained)
    assert 'aria-label="Training progress of bert"' in page
    assert f'<time datetime="{T0.isoformat()}">' in page


def test_the_details_tab_carries_the_loss_curve_and_its_library(login, owner, trained):
    html = detail(login(owner), trained)
    points = json.loads(re.search(r'<script id="loss-points" type="application/json">(.*?)</script>', html, re.S).group(1))
    assert len(points) == 50 and points[0] == {"step": 1, "loss": 1.0, "lr": None, "epoch": None, "values": {}}
    assert "/static/vendor/uplot/uPlot.iife.min.js" in html and "/static/console/loss_chart.js" in html


def test_the_checkpoints_tab_lists_commits_newest_first_with_the_work_at_risk(login, owner, trained):
    for step in (10, 20):
        Checkpoint.objects.create(
            job=trained,
            attempt=1,
            step=step,
            bytes=2_500_000,
            blocking_s=0.0123,
            persist_s=1.5,
            path=f"/out/ck/step-{step}",
            committed_at=T0 + timedelta(seconds=step),
        )
    html = detail(login(owner), trained, tab="checkpoints")
    assert [int(s) for s in re.findall(r'<tr data-step="(\d+)"', html)] == [20, 10]
    assert "2.4\xa0MB" in html and "0.0123 s" in html and "1.5 s" in html and "/out/ck/step-20" in html
    assert f'data-since-at="{(T0 + timedelta(seconds=20)).isoformat()}"' in html
    assert "Time since the last checkpoint" in html and "The work at risk if the node died now" in html


def test_without_checkpoints_the_tab_says_so(login, owner, make_job):
    html = detail(login(owner), make_job(), tab="checkpoints")
    assert "No committed checkpoints yet" in html and "No checkpoint yet" in html


def test_the_failover_tab_shows_each_attempt_with_node_gpus_cause_and_evidence(login, owner, make_job, nodes):
    job = put_in_status(make_job(name="llama"), JobStatus.RUNNING, failover_count=1)
    first = JobAttempt.objects.create(
        job=job,
        number=1,
        state="exited",
        started_at=T0,
        ended_at=T0 + timedelta(minutes=5),
        exit_signal=9,
        cause="killed by signal 9",
        verdict="hardware",
        verdict_reason="Xid 79 on node-a GPU 0",
        evidence={"findings": [{"kind": "xid", "gpu": 0, "xid": 79}], "source": "simulated"},
    )
    AttemptNode.objects.create(attempt=first, node=Node.objects.get(name="node-a"), gpu_indices=[0])
    second = JobAttempt.objects.create(job=job, number=2, state="running", started_at=T0 + timedelta(minutes=6), resume_step=40)
    AttemptNode.objects.create(attempt=second, node=Node.objects.get(name="node-b"), gpu_indices=[1])
    JobEvent.objects.create(
        job=job, from_status="Running", to_status="Pending - failoverinprogress", reason="exit: SIGKILL", attempt=1, created_at=T0 + timedelta(minutes=5)
    )
    JobEvent.objects.create(
        job=job,
        from_status="Pending - failoverinprogress",
        to_status="Running",
        reason="attempt 2 on node-b GPU 1 after a GPU fault",
        attempt=2,
        created_at=T0 + timedelta(minutes=6),
    )
    html = detail(login(owner), job, tab="failover")
    assert re.findall(r'class="timeline__item[^"]*" data-attempt="(\d+)"', html) == ["1", "2"]
    assert "node-a: GPU 0" in html and "node-b: GPU 1" in html
    assert "SIGKILL (9)" in html and "hardware fault" in html and "Xid 79 on node-a GPU 0" in html
    assert "checkpoint step 40" in html
    assert shows(html, '[{"gpu": 0, "kind": "xid", "xid": 79}]')
    assert "attempt 2 on node-b GPU 1 after a GPU fault" in html
    assert "data-refresh-on-status" in html
    # The node's evidence is the cause: the run's last line (a progress bar) is not quoted as it.
    add_log_lines(job, 3)
    LogLine.objects.filter(job=job, seq=3).update(text=" 45%|████▌     | 450/1000 [00:09<00:11, 48.2it/s]")
    assert "data-failing-line" not in detail(login(owner), job, tab="failover")
    # A fault the run's own log told: the line the verdict quoted is the cause's link, not the last one.
    LogLine.objects.filter(job=job, seq=2).update(text="RuntimeError: CUDA error: uncorrectable ECC error encountered")
    JobAttempt.objects.filter(pk=first.pk).update(
        evidence={"source": "log", "signature": "ecc", "matched": "RuntimeError: CUDA error: uncorrectable ECC error encountered"}
    )
    html = detail(login(owner), job, tab="failover")
    assert 'data-log-link="2"' in html and 'data-log-link="3"' not in html


def test_the_tabs_are_offered_and_hidden_from_outsiders(login, owner, outsider, make_job):
    job = make_job()
    html = detail(login(owner), job)
    assert '<a href="?tab=checkpoints" class="tabs__tab">Checkpoints</a>' in html
    assert '<a href="?tab=failover" class="tabs__tab">Failover</a>' in html
    client = login(outsider)
    for tab in ("checkpoints", "failover"):
        assert client.get(reverse("jobs:detail", args=[job.pk]), {"tab": tab}).status_code == 404


def test_the_catch_up_fetch_returns_only_visible_jobs(login, owner, outsider, trained, make_job):
    theirs = make_job(owner=outsider, name="theirs")
    body = login(owner).get(reverse("jobs:live"), {"ids": f"{trained.pk},{theirs.pk},abc,,-3,{'9' * 40}"}).json()
    assert body["now"]
    assert [job["id"] for job in body["jobs"]] == [trained.pk]
    job = body["jobs"][0]
    assert (job["status"], job["badge"], job["icon"], job["started_at"]) == ("Running", "running", "play", T0.isoformat())
    assert job["progress"]["percent"] == 25.0
    assert login(outsider).get(reverse("jobs:live"), {"ids": str(trained.pk)}).json()["jobs"] == []


def test_the_catch_up_fetch_needs_a_login(client, trained):
    response = client.get(reverse("jobs:live"), {"ids": str(trained.pk)})
    assert response.status_code == 302


def test_the_live_script_and_socket_are_on_the_list_and_detail_pages(login, owner, trained):
    client = login(owner)
    listing = client.get(reverse("jobs:list")).content.decode()
    assert 'data-socket-path="/ws/training-jobs/"' in listing and "/static/console/live.js" in listing
    page = detail(client, trained)
    assert f'data-socket-path="/ws/training-jobs/?job={trained.pk}"' in page
