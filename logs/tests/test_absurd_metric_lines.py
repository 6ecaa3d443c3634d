"""A forged or absurd progress or commit line costs only itself: the batch it came in is stored
whole, and the batch's valid progress and checkpoint lines still count."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ckptlib import CheckpointResult
from logs.models import Checkpoint, JobProgress, LogLine, MetricPoint
from logs.progress_parser import INTERESTING, MAX_COUNT, may_tell, parse_line
from logs.services import RawLine, ingest_lines

pytestmark = pytest.mark.usefixtures("fresh_throttle")

T0 = datetime(2026, 12, 2, 4, 0, tzinfo=UTC)
HUGE = 10**30


def commit(step: object, nbytes: object = 1000, blocking: str = "0.010000", persist: str = "0.500000") -> str:
    return f"[Concurrent Checkpoint] committed step={step} bytes={nbytes} blocking_s={blocking} persist_s={persist} path=/out/concurrent_checkpoint/step-{step}"


ABSURD = [
    commit(HUGE),  # the step no database column holds
    commit("9" * 5000),  # more digits than Python turns into an int
    commit(20, nbytes=HUGE),
    commit(21, blocking="9" * 400 + ".0"),  # infinite seconds
    f"step {HUGE}/{HUGE * 2} loss 0.75",
    "{'loss': 1.5, 'epoch': " + "9" * 400 + "}",  # an int too large for a float
    f" 50%|█████     | {HUGE}/{HUGE * 2} [00:01<00:01,  4.31it/s]",
    f"global_step={'7' * 5000}",
]


@pytest.mark.django_db
def test_a_mixed_batch_keeps_its_lines_and_its_valid_checkpoint(make_job):
    job = make_job()
    valid_commit = CheckpointResult(step=40, path="/out/concurrent_checkpoint/step-40", bytes=4096, blocking_s=0.02, persist_s=0.3, committed=True).log_line()
    texts = ["Starting dataset initialization", "step 30/400 loss 0.5", *ABSURD, valid_commit, "step 40/400 loss 0.25", "done"]
    lines = [RawLine(i, T0 + timedelta(seconds=i), text) for i, text in enumerate(texts, start=1)]
    stored = ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=lines)
    assert [line["text"] for line in stored] == texts
    assert list(LogLine.objects.filter(job=job).order_by("seq").values_list("text", flat=True)) == texts
    assert list(Checkpoint.objects.filter(job=job).values_list("step", "bytes", "ranks")) == [(40, 4096, 1)]
    progress = JobProgress.objects.get(job=job)
    assert (progress.step, progress.total, progress.loss) == (40, 400, 0.25)
    assert all(abs(step) < MAX_COUNT for step in MetricPoint.objects.filter(job=job).values_list("step", flat=True))


@pytest.mark.parametrize("text", ABSURD)
def test_an_absurd_value_is_not_told(text):
    found = parse_line(text)
    if found is None:
        return
    assert found.checkpoint is None
    told = found.progress
    assert told is not None
    assert told.step is None and told.total is None
    assert told.epoch is None  # the loss that line tells is still told


@pytest.mark.django_db
def test_ranks_adding_up_to_absurd_byte_counts_stay_in_the_column(make_job):
    job = make_job()
    near = MAX_COUNT - 1
    lines = [RawLine(i, T0, commit(5, nbytes=near)) for i in range(1, 4)]
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=lines)
    ingest_lines(job_id=job.pk, stream="worker-1", attempt=1, lines=[RawLine(1, T0, commit(5, nbytes=near))])
    (row,) = Checkpoint.objects.filter(job=job)
    assert (row.step, row.ranks) == (5, 4) and row.bytes <= 2**63 - 1


@pytest.mark.parametrize(
    "text",
    [
        "epoch 1/3 step 50/150 loss 0.036 lr 0.01",
        "LR: 0.1",
        "lr",
        "already",
        "42/100 [00:01<00:02",
        "a/100 [",
        "path/to/x [1]",
        "{'learning_rate': 5e-05}",
        "[Concurrent Checkpoint] committed step=1",
        "Training complete",
        "x" * 16000,
        "Step",
    ],
)
def test_the_runners_fast_test_agrees_with_the_pattern(text):
    assert may_tell(text) == bool(INTERESTING.search(text))
