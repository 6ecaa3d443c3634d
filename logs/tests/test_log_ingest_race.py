"""Two ingesters of one job's log at once (two agents after a lost node, a retried batch): every
line is stored once, the seqs stay contiguous, and neither raises. Real concurrency needs a
database with row locks: it runs in the PostgreSQL pass."""
from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from django.db import close_old_connections, connection

from logs.models import LogLine, LogVolume
from logs.services import RawLine, ingest_lines

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def batch(attempt: int, first: int, count: int) -> list[RawLine]:
    return [RawLine(line_no=n, ts=NOW, text=f"attempt {attempt} line {n}") for n in range(first, first + count)]


def test_two_ingesters_of_one_attempt_store_each_line_once(make_job):
    if connection.vendor != "postgresql":
        pytest.skip("row locks between connections: the PostgreSQL pass runs this")
    job = make_job()
    errors: list[BaseException] = []
    start = threading.Barrier(4)

    def ingest(first: int) -> None:
        try:
            start.wait()
            for offset in range(0, 2000, 250):
                ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch(1, first + offset, 250))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            close_old_connections()

    # Four threads deliver overlapping ranges of the same attempt's lines (1..2000 and 501..2500).
    threads = [threading.Thread(target=ingest, args=(first,)) for first in (1, 1, 501, 501)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = list(LogLine.objects.filter(job=job).order_by("seq").values_list("seq", "line_no"))
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1)), "contiguous seqs"
    line_nos = [n for _, n in rows]
    assert len(line_nos) == len(set(line_nos)), "no line stored twice"
    assert set(line_nos) <= set(range(1, 2501))
    assert LogVolume.objects.get(job=job).lines == len(rows)


def test_a_batch_delivered_again_after_its_lines_were_purged_is_not_stored_again(make_job):
    job = make_job()
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch(1, 1, 10))
    LogLine.objects.filter(job=job).delete()
    assert ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch(1, 1, 12)) != []
    assert list(LogLine.objects.filter(job=job).values_list("line_no", flat=True)) == [11, 12]
