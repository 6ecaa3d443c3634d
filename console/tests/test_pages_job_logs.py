"""The Logs tab shows the last 1000 stored lines of a stream, in order, with timestamps and a stream selector."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from harness.pages import add_log_lines, put_in_status
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def log_tab(client, job, **params) -> str:
    response = client.get(reverse("jobs:detail", args=[job.pk]), {"tab": "logs", **params})
    assert response.status_code == 200
    return response.content.decode()


def seqs(html: str) -> list[int]:
    return [int(s) for s in re.findall(r'<li id="L\d+" data-seq="(\d+)"', html)]


def test_it_shows_the_master_stream_in_order_with_timestamps(login, owner, make_job):
    job = make_job()
    add_log_lines(job, 5)
    html = log_tab(login(owner), job)
    assert seqs(html) == [1, 2, 3, 4, 5]
    assert '<ol id="log"' in html
    assert re.search(
        r'<li id="L1" data-seq="1" data-attempt="1"><time datetime="[^"]+">\d\d:\d\d:\d\d</time><span class="log__text">master line 1</span>', html
    )


def test_it_shows_only_the_last_1000_lines_and_says_so(login, owner, make_job):
    job = make_job()
    add_log_lines(job, 1005)
    html = log_tab(login(owner), job)
    assert seqs(html) == list(range(6, 1006))
    assert "Showing the last 1000 lines." in html


def test_lines_of_every_attempt_are_merged_by_seq(login, owner, make_job):
    job = make_job()
    add_log_lines(job, 3, attempt=1)
    add_log_lines(job, 3, attempt=2, first_seq=4)
    html = log_tab(login(owner), job)
    assert seqs(html) == [1, 2, 3, 4, 5, 6]
    assert re.findall(r'data-attempt="(\d)"', html) == ["1", "1", "1", "2", "2", "2"]


def test_a_multi_node_job_offers_a_stream_selector(login, owner, make_job):
    job = make_job(node_count=3)
    add_log_lines(job, 2)
    add_log_lines(job, 4, stream="worker-2")
    add_log_lines(job, 3, stream="worker-1")
    client = login(owner)
    html = log_tab(client, job)
    assert re.findall(r'<option value="([^"]+)"', html) == ["master", "worker-1", "worker-2"]
    assert '<label for="log-stream">Stream</label>' in html
    worker = log_tab(client, job, stream="worker-2")
    assert seqs(worker) == [1, 2, 3, 4]
    assert "worker-2 line 4" in worker
    assert "master line" not in worker


def test_a_single_stream_job_has_no_selector(login, owner, make_job):
    job = make_job()
    add_log_lines(job, 2)
    assert 'id="log-stream"' not in log_tab(login(owner), job)


def test_an_unknown_stream_falls_back_to_master(login, owner, make_job):
    job = make_job()
    add_log_lines(job, 2)
    assert seqs(log_tab(login(owner), job, stream="nope")) == [1, 2]


def test_a_job_without_logs_says_so_and_why(login, owner, make_job):
    assert "No log lines yet: the job waits to be placed" in log_tab(login(owner), make_job())
    stuck = put_in_status(make_job(name="bad-image"), JobStatus.IMAGE_PULL_BACKOFF, status_reason="image nope:1 could not be pulled: not found")
    html = log_tab(login(owner), stuck)
    assert "No log lines: the run has not started, because its image could not be pulled (image nope:1 could not be pulled: not found)" in html
    assert "No log lines yet." not in html


def test_log_text_is_escaped(login, owner, make_job):
    from django.utils import timezone

    from logs.models import LogLine

    job = make_job()
    LogLine.objects.create(job=job, stream="master", attempt=1, seq=1, line_no=1, ts=timezone.now(), text="<script>alert(1)</script>")
    html = log_tab(login(owner), job)
    assert "<script>alert(1)</script>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_teammate_reads_the_logs_of_a_shared_job(login, teammate, make_job):
    job = make_job()
    add_log_lines(job, 2)
    assert seqs(log_tab(login(teammate), job)) == [1, 2]


def test_the_tab_without_javascript_shows_terminal_lines_without_control_sequences(login, owner, make_job):
    from logs.models import LogLine

    job = make_job()
    add_log_lines(job, 1)
    LogLine.objects.filter(job=job).update(text="\x1b[A{'eval_loss': 4.9}\x1b[31m red\x1b[0m")
    html = log_tab(login(owner), job)
    assert '<span class="log__text">{&#x27;eval_loss&#x27;: 4.9} red</span>' in html
    assert "\x1b" not in html
