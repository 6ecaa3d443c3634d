"""Reading log lines: every query that reads ``LogLine`` lives here (pages, the REST API, the log
socket, the failover policy, and ingestion's own reads: the last line and ``seq`` stored, and the
job's ``LogVolume`` row it locks)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

from django.db import connection, models

from jobs.models import JobEvent
from logs.models import Checkpoint, LogLine, LogVolume

STREAM_NAME = r"^(master|worker-[1-9][0-9]{0,3})$"  # as the API schema shows it


def is_stream_name(name: str) -> bool:
    """``master`` or ``worker-<n>``, exactly (``$`` alone would let a trailing newline through)."""
    return re.fullmatch(STREAM_NAME[1:-1], name) is not None


CHUNK = 5000


# --- ingestion's reads (``logs.services.ingest_lines``, inside its transaction) ------------------
# Plain SQL on the caller's connection, as ingestion's insert is: one statement each, no ORM work.
def _scalar(sql: str, params: list) -> Any:
    table = connection.ops.quote_name(LogLine._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql.format(table=table), params)
        return cursor.fetchone()[0]


VOLUME_COLUMNS = ("id", "lines", "head", "dropped", "seen", "markers", "starts", "tails")
JSON_COLUMNS = ("seen", "markers", "starts", "tails")


def volume_field(name: str) -> models.Field:
    return cast(models.Field, LogVolume._meta.get_field(name))


def read_volume(job_id: int) -> LogVolume | None:
    """The job's ``LogVolume`` row, locked (``FOR UPDATE`` where the database has it; SQLite's
    write transaction already holds the database), or None."""
    columns = ", ".join(connection.ops.quote_name(name) for name in VOLUME_COLUMNS)
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {columns} FROM {connection.ops.quote_name(LogVolume._meta.db_table)} WHERE job_id = %s{lock}", [job_id])
        row = cursor.fetchone()
    if row is None:
        return None
    pk, *values = [
        volume_field(name).from_db_value(value, None, connection) if name in JSON_COLUMNS else value  # type: ignore[attr-defined]
        for name, value in zip(VOLUME_COLUMNS, row, strict=True)
    ]
    # from_db takes the values in the model's field order: id, job, then the others.
    return LogVolume.from_db(connection.alias, ["id", "job_id", *VOLUME_COLUMNS[1:]], [pk, job_id, *values])


def last_line_no(job_id: int, stream: str, attempt: int) -> int | None:
    """The highest ``line_no`` stored for the attempt's stream (None: none yet)."""
    return _scalar("SELECT MAX(line_no) FROM {table} WHERE job_id = %s AND stream = %s AND attempt = %s", [job_id, stream, attempt])


def last_seq(job_id: int, stream: str) -> int:
    """The stream's highest ``seq`` across attempts (0: no line yet)."""
    return _scalar("SELECT MAX(seq) FROM {table} WHERE job_id = %s AND stream = %s", [job_id, stream]) or 0


def line_at(job_id: int, stream: str, seq: int) -> list[int] | None:
    """The attempt and line number of the stream's row at ``seq`` (the first of its tail after
    older rows went), or None."""
    found = LogLine.objects.filter(job_id=job_id, stream=stream, seq=seq).values_list("attempt", "line_no").first()
    return list(found) if found is not None else None


def attempt_first_seqs(job_id: int, stream: str) -> list[tuple[int, int]]:
    """Each attempt of the stream with the seq of its first line (read once per stream, for
    lines stored before ``LogVolume.starts`` kept them)."""
    table = connection.ops.quote_name(LogLine._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT attempt, MIN(seq) FROM {table} WHERE job_id = %s AND stream = %s GROUP BY attempt", [job_id, stream])
        return [(attempt, first) for attempt, first in cursor.fetchall()]


def stored_line_count(job_id: int) -> int:
    """How many lines the job has stored (counted once, for a job whose lines predate its ``LogVolume``)."""
    return LogLine.objects.filter(job_id=job_id).count()


def line_payload(line: LogLine) -> dict:
    return {"seq": line.seq, "attempt": line.attempt, "ts": line.ts.isoformat(), "text": line.text}


def attempt_banners(job_id: int) -> dict[int, str]:
    """Per attempt after the first, the line a viewer shows where that attempt's output begins,
    e.g. "attempt 2 on node-b GPU 0 after a GPU fault: Xid 79 … on node-a"."""
    banners: dict[int, str] = {}
    rows = JobEvent.objects.filter(job_id=job_id, to_status="Running", attempt__gt=1).order_by("id").values_list("attempt", "reason")
    for attempt, reason in rows:
        if attempt is not None:  # never, past the filter; the column is nullable
            banners[attempt] = reason
    return banners


def lines_after(job_id: int, stream: str, after: int, limit: int) -> list[dict]:
    rows = LogLine.objects.filter(job_id=job_id, stream=stream, seq__gt=after).order_by("seq")[:limit]
    return [line_payload(r) for r in rows]


def tail_lines(job_id: int, stream: str, count: int) -> list[dict]:
    rows = list(LogLine.objects.filter(job_id=job_id, stream=stream).order_by("-seq")[:count])
    rows.reverse()
    return [line_payload(r) for r in rows]


def read_log_page(job_id: int, *, stream: str, limit: int, after: int | None = None, before: int | None = None, q: str | None = None) -> dict[str, Any]:
    """One page of a job's log stream, ascending by ``seq``.

    Forward from ``after`` (up to ``before``), or — with ``before`` and no ``after`` — the last
    ``limit`` lines before ``before`` (the tail page). One row past the limit tells ``has_more``.
    """
    lines = LogLine.objects.filter(job_id=job_id, stream=stream)
    if after is not None:
        lines = lines.filter(seq__gt=after)
    if before is not None:
        lines = lines.filter(seq__lt=before)
    if q:
        lines = lines.filter(text__icontains=q)
    tail = before is not None and after is None
    rows = list(lines.order_by("-seq" if tail else "seq").values("seq", "attempt", "ts", "text")[: limit + 1])
    has_more = len(rows) > limit
    rows = rows[:limit]
    if tail:
        rows.reverse()
    return {"lines": rows, "next_after": rows[-1]["seq"] if rows else None, "has_more": has_more}


def stream_text(job_id: int, stream: str) -> Iterator[bytes]:
    """Every line of the stream in seq order, read in keyset pages so memory stays flat."""
    last = 0
    while True:
        rows = list(LogLine.objects.filter(job_id=job_id, stream=stream, seq__gt=last).order_by("seq").values_list("seq", "text")[:CHUNK])
        if not rows:
            return
        last = rows[-1][0]
        yield ("\n".join(text for _, text in rows) + "\n").encode("utf-8")


def last_lines(job_id: int, *, attempt: int, count: int) -> list[str]:
    """The texts of an attempt's last ``count`` lines (every stream), oldest first."""
    texts = list(LogLine.objects.filter(job_id=job_id, attempt=attempt).order_by("-seq").values_list("text", flat=True)[:count])
    texts.reverse()
    return texts


def stream_order(stream: str) -> tuple[int, int, str]:
    """``master`` first, then ``worker-1``, ``worker-2`` … by number, then anything else."""
    if stream == "master":
        return (0, 0, stream)
    prefix, _, number = stream.rpartition("-")
    if prefix == "worker" and number.isdigit():
        return (1, int(number), stream)
    return (2, 0, stream)


@dataclass(frozen=True)
class StreamTail:
    streams: list[str]  # every stream the job has, master first
    stream: str  # the one shown
    lines: list[LogLine]  # its last lines, oldest first
    truncated: bool  # whether older lines exist


def stream_tail(job_id: int, requested_stream: str | None, count: int) -> StreamTail:
    """The last ``count`` lines of the requested stream (else master, else the first)."""
    streams = sorted(set(LogLine.objects.filter(job_id=job_id).order_by().values_list("stream", flat=True).distinct()), key=stream_order)
    if requested_stream in streams:
        stream = requested_stream
    else:
        stream = "master" if "master" in streams or not streams else streams[0]
    lines = list(LogLine.objects.filter(job_id=job_id, stream=stream).order_by("-seq")[:count])[::-1]
    earlier = bool(lines) and LogLine.objects.filter(job_id=job_id, stream=stream, seq__lt=lines[0].seq).exists()
    return StreamTail(streams, stream, lines, earlier)


# What a failing line looks like: a Python exception, a shell or launcher error, a CUDA/NCCL error.
FAILURE_TEXT = re.compile(r"Traceback|Error\b|Exception\b|error:|command not found|Killed|CUDA error|NCCL", re.IGNORECASE)
FAILURE_SCAN = 200


def failing_line(job_id: int, *, attempt: int) -> LogLine | None:
    """The line that tells why an attempt failed: among its last lines (every stream), the newest
    one that reads like an error (an exception's last line rather than its Traceback header),
    else its very last line; None when it wrote nothing."""
    lines = list(LogLine.objects.filter(job_id=job_id, attempt=attempt).order_by("-seq").only("seq", "stream", "attempt", "text")[:FAILURE_SCAN])
    for line in lines:
        if FAILURE_TEXT.search(line.text) and not line.text.startswith("Traceback"):
            return line
    return lines[0] if lines else None


def line_with_text(job_id: int, *, attempt: int, text: str) -> LogLine | None:
    """The newest of an attempt's last lines (every stream) whose text is ``text``: the line a
    verdict's evidence quoted; None when it is not among them."""
    lines = LogLine.objects.filter(job_id=job_id, attempt=attempt).order_by("-seq").only("seq", "stream", "attempt", "text")[:FAILURE_SCAN]
    return next((line for line in lines if line.text == text), None)


def last_checkpoint_step(job_id: int) -> int | None:
    """The step of the job's newest committed checkpoint (what Resume starts from), or None."""
    return Checkpoint.objects.filter(job_id=job_id).order_by("-committed_at", "-id").values_list("step", flat=True).first()
