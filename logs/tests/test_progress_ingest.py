"""Ingesting log lines keeps a job's progress, loss curve and checkpoints, with few queries."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ckptlib import CheckpointResult
from jobs.realtime import job_metrics_group
from logs import progress as progress_module
from logs.models import Checkpoint, JobProgress, MetricPoint
from logs.progress import SAMPLES_PER_BATCH, chart_points
from logs.services import RawLine, ingest_lines

pytestmark = pytest.mark.usefixtures("fresh_throttle")

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def ingest(job_id: int, texts: list[str], *, start: int = 1, attempt: int = 1, stream: str = "master"):
    lines = [RawLine(line_no=start + i, ts=T0 + timedelta(seconds=start + i), text=t) for i, t in enumerate(texts)]
    return ingest_lines(job_id=job_id, stream=stream, attempt=attempt, lines=lines)


def commit_line(step: int, nbytes: int = 1000, blocking: float = 0.01, persist: float = 0.5) -> str:
    return CheckpointResult(
        step=step, path=f"/out/concurrent_checkpoint/step-{step}", bytes=nbytes, blocking_s=blocking, persist_s=persist, committed=True
    ).log_line()


@pytest.mark.django_db
def test_the_example_scripts_lines_become_the_jobs_progress_and_loss_curve(make_job):
    job = make_job()
    ingest(job.pk, ["Starting dataset initialization", "epoch 1/3 step 50/150 loss 0.5 lr 0.01", "epoch 2/3 step 100/150 loss 0.2 lr 0.01"])
    progress = JobProgress.objects.get(job=job)
    assert (progress.step, progress.total, progress.epoch, progress.loss, progress.lr) == (100, 150, 2.0, 0.2, 0.01)
    assert progress.percent == pytest.approx(66.667, abs=0.01)
    assert list(MetricPoint.objects.filter(job=job).values_list("step", "loss")) == [(50, 0.5), (100, 0.2)]

    ingest(job.pk, ["epoch 3/3 step 150/150 loss 0.1 lr 0.01", "Training complete: final loss 0.09"], start=4)
    progress.refresh_from_db()
    assert (progress.step, progress.loss) == (150, 0.09)
    # The later line's loss wins; the learning rate the step's first line told stays.
    assert chart_points(job.pk)[-1] == {"step": 150, "loss": 0.09, "lr": 0.01, "epoch": 3.0, "values": {}}


@pytest.mark.django_db
def test_commit_lines_become_checkpoints_and_ranks_of_one_step_add_up(make_job):
    job = make_job()
    ingest(job.pk, [commit_line(10, 1000, 0.01, 0.5), commit_line(10, 2000, 0.02, 0.4)])
    ingest(job.pk, [commit_line(10, 500, 0.005, 0.9), commit_line(20)], start=3)
    rows = list(Checkpoint.objects.filter(job=job).order_by("step").values_list("step", "bytes", "blocking_s", "persist_s", "ranks"))
    assert rows == [(10, 3500, 0.02, 0.9, 3), (20, 1000, 0.01, 0.5, 1)]
    # The same step in a later attempt is a checkpoint of its own.
    ingest(job.pk, [commit_line(10)], start=1, attempt=2)
    assert Checkpoint.objects.filter(job=job, step=10).count() == 2


@pytest.mark.django_db
def test_a_batch_that_tells_no_progress_costs_no_extra_query(make_job):
    job = make_job()
    ingest(job.pk, ["warm up"])
    with CaptureQueriesContext(connection) as plain:
        ingest(job.pk, [f"plain line {i}" for i in range(500)], start=2)
    with CaptureQueriesContext(connection) as told:
        ingest(job.pk, [f"step {i}/1000 loss {1 / i:.4f}" for i in range(1, 501)], start=600)
    assert not [q for q in plain.captured_queries if "jobprogress" in q["sql"] or "metricpoint" in q["sql"]]
    # Progress: read the row, save it; the points go in bulk (SQLite splits a bulk insert in chunks).
    assert len([q for q in told.captured_queries if "logs_jobprogress" in q["sql"]]) == 2
    assert len([q for q in told.captured_queries if "logs_metricpoint" in q["sql"]]) <= 5
    # One batch adds an even subset of its points to the curve, its last step included.
    steps = list(MetricPoint.objects.filter(job=job).order_by("step").values_list("step", flat=True))
    assert len(steps) == SAMPLES_PER_BATCH and steps[0] == 1 and steps[-1] == 500


@pytest.mark.django_db
def test_the_loss_curve_stays_bounded(make_job, monkeypatch):
    monkeypatch.setattr(progress_module, "MAX_POINTS", 50)
    job = make_job()
    for batch in range(10):
        ingest(job.pk, [f"step {batch * 30 + i} loss 1.0" for i in range(1, 31)], start=batch * 30 + 1)
    count = MetricPoint.objects.filter(job=job).count()
    assert count <= 100
    steps = list(MetricPoint.objects.filter(job=job).values_list("step", flat=True))
    assert steps[0] == 1 and steps[-1] == 300
    assert len(chart_points(job.pk, limit=20)) == 20


@pytest.mark.django_db
def test_worker_streams_count_for_checkpoints_only(make_job):
    job = make_job()
    ingest(job.pk, ["step 5/10 loss 1.0", commit_line(5)], stream="worker-1")
    assert not JobProgress.objects.filter(job=job).exists()
    assert Checkpoint.objects.filter(job=job, step=5).exists()


@pytest.mark.django_db(transaction=True)
def test_progress_is_published_after_commit_and_throttled(make_job):
    job = make_job()
    layer = get_channel_layer()
    async_to_sync(layer.group_add)(job_metrics_group(job.pk), "probe")
    ingest(job.pk, ["step 1/10 loss 1.0"])
    message = async_to_sync(layer.receive)("probe")
    assert message["type"] == "job.progress" and message["job"] == job.pk
    assert (message["progress"]["step"], message["progress"]["total"], message["progress"]["percent"]) == (1, 10, 10.0)
    # Within the interval plain progress waits, a checkpoint does not.
    ingest(job.pk, ["step 2/10 loss 0.9"], start=2)
    ingest(job.pk, [commit_line(2)], start=3)
    message = async_to_sync(layer.receive)("probe")
    assert message["progress"]["step"] == 2
    assert [c["step"] for c in message["checkpoints"]] == [2]


@pytest.mark.django_db
def test_a_metrics_failure_never_costs_the_log_its_lines(make_job, monkeypatch):
    job = make_job()

    def broken(*args, **kwargs):
        raise RuntimeError("metrics store is broken")

    monkeypatch.setattr(progress_module, "save_progress", broken)
    stored = ingest(job.pk, ["step 1/10 loss 1.0", "next line"])
    assert [line["text"] for line in stored] == ["step 1/10 loss 1.0", "next line"]
    assert job.log_lines.count() == 2 and not JobProgress.objects.filter(job=job).exists()
