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

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.database]

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def batch(attempt: int, first: int, count: int) -> list[RawLine]:
    return [RawLine(line_no=n, ts=NOW, text=f"attempt {attempt} line {n}") for n in range(first, first + count)]


@pytest.mark.slow  # threads racing for the database
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
        except BaseException as exc:  # reported below
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


@pytest.mark.slow  # threads racing for the database
def test_two_agents_ingesting_one_log_at_once_keep_it_in_attempt_order(make_job):
    """Two agents after a lost node: node-x's agent, back, delivers attempt 1's late lines (twice: a
    retry) while node-y's agent stores attempt 2's live ones. No ``UniqueViolation`` on
    ``logline_unique_seq``, every line once, seqs contiguous, all of attempt 1 before attempt 2."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks between connections: the PostgreSQL pass runs this")
    job = make_job()
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch(1, 1, 472))
    ingest_lines(job_id=job.pk, stream="master", attempt=2, lines=batch(2, 1, 83))
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def deliver(attempt: int, first: int, count: int, size: int) -> None:
        try:
            start.wait()
            for offset in range(0, count, size):
                ingest_lines(job_id=job.pk, stream="master", attempt=attempt, lines=batch(attempt, first + offset, min(size, count - offset)))
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()  # this thread's own connection

    threads = [
        threading.Thread(target=deliver, args=(1, 473, 1655, 100)),  # node-x's agent, back
        threading.Thread(target=deliver, args=(1, 473, 1655, 250)),  # the same lines delivered again (a retry)
        threading.Thread(target=deliver, args=(2, 84, 1000, 50)),  # node-y's agent, live
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    rows = list(LogLine.objects.filter(job=job, stream="master").order_by("seq").values_list("seq", "attempt", "line_no"))
    assert [seq for seq, _, _ in rows] == list(range(1, len(rows) + 1)), "contiguous seqs"
    assert [(attempt, line_no) for _, attempt, line_no in rows] == [(1, n) for n in range(1, 2128)] + [(2, n) for n in range(1, 1084)]
    volume = LogVolume.objects.get(job=job)
    assert volume.lines == len(rows)
    assert volume.starts == {"master": {"1": 1, "2": 2128}}
