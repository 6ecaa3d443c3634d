"""Every number the Trainer logs is kept at its step: the training dict's loss and learning rate
as before, its grad_norm, and an evaluation's eval_loss and the rest, merged into the step's point
even when they arrive in a later batch; strings of numbers (newer transformers print them) count,
names that are no metric's and values that are no number do not."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from logs.models import MetricPoint
from logs.progress import chart_points, metric_names
from logs.progress_parser import read_candidate
from logs.services import RawLine, ingest_lines

pytestmark = [pytest.mark.django_db, pytest.mark.database, pytest.mark.usefixtures("fresh_throttle")]

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
BAR = " 10%|█         | {step}/400 [00:05<00:45,  2.00it/s]"


def ingest(job_id: int, texts: list[str], start: int) -> None:
    lines = [RawLine(line_no=start + i, ts=T0 + timedelta(seconds=start + i), text=t) for i, t in enumerate(texts)]
    ingest_lines(job_id=job_id, stream="master", attempt=1, lines=lines)


def test_a_trainer_dict_tells_its_progress_and_every_other_number():
    found = read_candidate(
        "{'eval_loss': '4.91', 'eval_runtime': 1.25, 'eval_samples_per_second': 32.0, 'epoch': 0.08, 'note': 'x', 'bad key': 1, 'flag': True}"
    )
    assert found.progress.epoch == 0.08 and found.progress.loss is None
    assert dict(found.values) == {"eval_loss": 4.91, "eval_runtime": 1.25, "eval_samples_per_second": 32.0}
    assert read_candidate("{'eval_loss': 'nan', 'x': 'inf'}") is None


def test_eval_metrics_join_the_steps_training_point_across_batches(make_job):
    job = make_job()
    ingest(job.pk, [BAR.format(step=10), "{'loss': '5.106', 'grad_norm': '1.608', 'learning_rate': '3.75e-05', 'epoch': '0.04'}"], start=1)
    ingest(job.pk, ["{'eval_loss': 4.9, 'eval_accuracy': 0.25, 'epoch': 0.04}"], start=3)
    ingest(job.pk, [BAR.format(step=20), "{'loss': 4.8, 'grad_norm': 1.2, 'learning_rate': 1.25e-05, 'epoch': 0.08}"], start=4)
    ingest(job.pk, [BAR.format(step=20), "{'eval_loss': 4.7, 'eval_accuracy': 0.30, 'epoch': 0.08}"], start=6)
    points = {p.step: p for p in MetricPoint.objects.filter(job=job)}
    assert (points[10].loss, points[10].lr) == (5.106, 3.75e-05)
    assert points[10].values == {"grad_norm": 1.608, "eval_loss": 4.9, "eval_accuracy": 0.25}
    assert (points[20].loss, points[20].values) == (4.8, {"grad_norm": 1.2, "eval_loss": 4.7, "eval_accuracy": 0.30})
    curve = chart_points(job.pk)
    assert [p["values"].get("eval_loss") for p in curve] == [4.9, 4.7]
    assert metric_names(curve) == ["loss", "eval_accuracy", "eval_loss", "grad_norm"]


def test_thinning_keeps_the_rare_evaluation_points(make_job):
    job = make_job()
    texts = []
    for step in range(1, 401):
        texts += [BAR.format(step=step), f"{{'loss': {1 / step}, 'epoch': {step / 400}}}"]
        if step % 100 == 0:
            texts.append(f"{{'eval_loss': {2 / step}, 'epoch': {step / 400}}}")
    for start in range(0, len(texts), 40):
        ingest(job.pk, texts[start : start + 40], start=start + 1)
    curve = chart_points(job.pk, limit=50)
    assert len(curve) <= 50 + 4
    assert [p["step"] for p in curve if "eval_loss" in p["values"]] == [100, 200, 300, 400]


def test_an_evaluation_in_a_flood_takes_the_step_it_was_logged_at(make_job):
    # A chatty run: many more lines a batch than are parsed; the evaluation's dict and the step
    # lines just before it are always read, so its point lands at its own step.
    job = make_job()
    texts = []
    for step in range(1, 1001):
        texts.append(f"step {step}/1000 loss {1 / step:.5f}")
        if step % 250 == 0:
            texts.append(f"{{'eval_loss': {2 / step}, 'epoch': {step / 1000}}}")
    ingest(job.pk, texts, start=1)
    assert [p["step"] for p in chart_points(job.pk) if "eval_loss" in p["values"]] == [250, 500, 750, 1000]
