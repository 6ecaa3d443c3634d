from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from logs.models import LogLine
from logs.services import RawLine, ingest_lines, purge_old_lines

pytestmark = pytest.mark.django_db


def test_lines_are_kept_until_the_job_is_deleted_unless_operators_set_a_maximum_age(make_job):
    job = make_job()
    now = timezone.now()
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=[RawLine(1, now - timedelta(days=40), "old"), RawLine(2, now, "new")])
    assert purge_old_lines(0) == 0
    assert purge_old_lines(30) == 1
    assert list(LogLine.objects.values_list("text", flat=True)) == ["new"]
    job.status = "Completed"
    job.save(update_fields=["status"])
    job.delete()
    assert not LogLine.objects.exists()


def test_a_redelivered_batch_is_stored_once(make_job):
    job = make_job()
    now = timezone.now()
    batch = [RawLine(i, now, f"l{i}") for i in range(1, 4)]
    assert len(ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch)) == 3
    assert ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch) == []
    ingest_lines(job_id=job.pk, stream="master", attempt=2, lines=[RawLine(1, now, "again")])
    rows = list(LogLine.objects.order_by("seq").values_list("seq", "attempt", "text"))
    assert rows == [(1, 1, "l1"), (2, 1, "l2"), (3, 1, "l3"), (4, 2, "again")]


def test_each_job_keeps_its_own_counts_and_progress_whatever_order_their_rows_were_made(make_job):
    """The job's LogVolume and JobProgress rows are read and written by hand: the second job's
    rows are made first here, so a row id that differs from its job's id cannot go unnoticed."""
    from logs.models import JobProgress, LogVolume

    first, second = make_job(), make_job()
    now = timezone.now()
    ingest_lines(job_id=second.pk, stream="master", attempt=1, lines=[RawLine(i, now, f"step {i} loss 0.{i}") for i in range(1, 6)])
    ingest_lines(job_id=first.pk, stream="master", attempt=1, lines=[RawLine(i, now, f"step {10 * i} loss 1.{i}") for i in range(1, 3)])
    assert LogVolume.objects.get(job=second).pk != second.pk or LogVolume.objects.get(job=first).pk != first.pk
    # Redelivered: dropped for the right job; new lines numbered after each job's own.
    assert ingest_lines(job_id=second.pk, stream="master", attempt=1, lines=[RawLine(5, now, "step 5 loss 0.5")]) == []
    more = ingest_lines(job_id=first.pk, stream="master", attempt=1, lines=[RawLine(3, now, "step 30 loss 1.3")])
    assert [line["seq"] for line in more] == [3]
    assert {v.job_id: (v.lines, v.seen) for v in LogVolume.objects.all()} == {
        second.pk: (5, {"master/1": 5}),
        first.pk: (3, {"master/1": 3}),
    }
    progress = {p.job_id: (p.step, p.loss) for p in JobProgress.objects.all()}
    assert progress == {second.pk: (5, 0.5), first.pk: (30, 1.3)}
