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
