"""Writing log lines: ingestion of the lines node agents send, and the purge of old ones.
Everything that reads them (ingestion's own reads too) is in ``logs.queries``."""

from __future__ import annotations

import logging
import math
import re
from bisect import bisect_right
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from operator import itemgetter
from typing import NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from prometheus_client import Counter

from jobs.realtime import log_group, publish
from logs.models import LogLine, LogVolume
from logs.progress import publish_progress, record_metrics
from logs.queries import attempt_first_seqs, last_line_no, last_seq, line_at, read_volume, stored_line_count, volume_field

logger = logging.getLogger(__name__)

# What a database refuses in text, stored as U+FFFD instead: NUL (PostgreSQL's text columns) and
# lone surrogates (not UTF-8).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


# Counted in the process that ingests (the console's embedded agent, or each node agent in
# scale-out, which serves it on its own METRICS_PORT); see docs/metrics.md.
LINES_INGESTED = Counter("satrain_log_lines_ingested_total", "Log lines stored (after dropping lines already stored)")


class RawLine(NamedTuple):
    """A line as the node agent captured it: its number in the attempt's output, time and text.
    The time is an aware datetime, or the unix time the runner recorded (the agent's path: a
    flood makes no datetime a line; ``utc_stamp`` reads both)."""

    line_no: int
    ts: datetime | float
    text: str


LINE_NO = itemgetter(0)  # a RawLine's line_no, at C speed


def ingest_lines(*, job_id: int, stream: str, attempt: int, lines: Sequence[RawLine]) -> list[dict]:
    """Store a batch of lines of one attempt, skipping those already stored.

    Delivery is at least once: a batch may come again after a retry or a restart, so lines whose
    ``line_no`` is not past the last one counted of the attempt are dropped (``apply_log_cap``,
    which also keeps the job's cap: past it, each stream's last lines in a rolling window).
    The stream reads attempt by attempt: ``seq`` continues from the stream's last one, except for
    a batch of an attempt that a later attempt already follows in the stream (a lost node's agent
    delivering what its run wrote meanwhile), which takes the seqs where its attempt ends, the
    later attempts' lines moving up to make room (``make_room``); viewers are told to read the
    stream again from there (a ``log.inserted`` message instead of ``log.lines``). The rows go
    in as plain tuples in one statement (``insert_rows``: the ORM's per-object work cost more
    than the database's). Returns the stored lines as the payloads published after commit, in
    order.
    """
    if not lines:
        return []
    # Per-line Python work is what ingest costs (the database's insert is C): each pass below is
    # one C-level call over the batch where it can be (one search of the joined text, a sort keyed
    # by itemgetter, bisect instead of a filter).
    if UNSTORABLE.search("\n".join([ln.text for ln in lines])):
        lines = [ln._replace(text=UNSTORABLE.sub("\ufffd", ln.text)) if UNSTORABLE.search(ln.text) else ln for ln in lines]
    table = connection.ops.quote_name(LogLine._meta.db_table)
    with transaction.atomic():
        # The job's LogVolume row, locked first: ingesters of one job (two agents after a lost
        # node) take turns, so each reads the last seq, line numbers and attempt starts the other
        # one wrote, and no two batches are given the same seqs.
        volume = locked_volume(job_id)
        starts = attempt_starts(volume, stream)
        later = [first for number, first in starts.items() if int(number) > attempt]
        first_seq = min(later) if later else last_seq(job_id, stream) + 1
        marker = volume.markers.get(stream)
        fresh, every = apply_log_cap(volume, stream, attempt, sorted(lines, key=LINE_NO), next_seq=first_seq, late=bool(later))
        if not every:
            return []
        fields = ["lines", "head", "dropped", "seen", "markers", "tails"]
        if fresh and (later or str(attempt) not in starts):
            if later:
                make_room(table, job_id, stream, first_seq, len(fresh))
                for number, first in starts.items():
                    if int(number) > attempt:
                        starts[number] = first + len(fresh)
                if marker is not None and marker >= first_seq:
                    volume.markers[stream] = marker + len(fresh)
            starts.setdefault(str(attempt), first_seq)
            fields.append("starts")
        save_volume(volume, fields)
        stamps = [utc_stamp(ln.ts) for ln in fresh]
        if fresh:
            insert_rows(
                table, [(job_id, stream, attempt, first_seq + i, ln.line_no, stamp, ln.text) for i, (ln, stamp) in enumerate(zip(fresh, stamps, strict=True))]
            )
        stored = [
            {"seq": first_seq + i, "attempt": attempt, "ts": stamp.replace(" ", "T", 1) + "+00:00", "text": ln.text}
            for i, (ln, stamp) in enumerate(zip(fresh, stamps, strict=True))
        ]
        if stored:
            # Inserted before a later attempt's lines: a viewer past ``first_seq`` holds lines whose
            # seqs moved, so it is told to read the stream again from there.
            payload = {"type": "log.inserted", "from_seq": first_seq} if later else {"type": "log.lines", "lines": stored}
            transaction.on_commit(lambda: publish(log_group(job_id, stream), payload))
            transaction.on_commit(lambda: LINES_INGESTED.inc(len(stored)))
            if later:
                logger.info("job %s: %s late line(s) of attempt %s stored before the next attempt's (from seq %s)", job_id, len(stored), attempt, first_seq)
        # Progress and checkpoints are read from every line, those past the log cap included.
        progress = record_metrics(job_id=job_id, stream=stream, attempt=attempt, lines=[(ln.ts, ln.text) for ln in every])
        if progress is not None:
            transaction.on_commit(lambda: publish_progress(job_id, progress))
    return stored


def attempt_starts(volume: LogVolume, stream: str) -> dict[str, int]:
    """The stream's ``{"attempt": first seq}`` in ``volume.starts`` (read from the rows once, for a
    stream whose lines predate it; a new stream's read finds none)."""
    starts = volume.starts.get(stream)
    if starts is None:
        starts = volume.starts[stream] = {str(number): first for number, first in attempt_first_seqs(volume.job_id, stream)}
    return starts


def make_room(table: str, job_id: int, stream: str, from_seq: int, count: int) -> None:
    """Move the stream's lines from ``from_seq`` on up by ``count`` seqs, inside the caller's
    transaction (the job's LogVolume row locked). Through negative seqs: a unique index is
    checked row by row, and ``seq + count`` would meet a row not moved yet."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {table} SET seq = -(seq + %s) WHERE job_id = %s AND stream = %s AND seq >= %s", [count, job_id, stream, from_seq])
        cursor.execute(f"UPDATE {table} SET seq = -seq WHERE job_id = %s AND stream = %s AND seq < 0", [job_id, stream])


def utc_stamp(ts: datetime | float) -> str:
    """``ts`` (an aware datetime, or a unix time) in UTC as ``YYYY-MM-DD HH:MM:SS[.ffffff]``: the
    text SQLite's datetime columns hold (what Django's ``adapt_datetimefield_value`` writes, at a
    fraction of its cost per line) and, with ``T`` and ``+00:00``, the ISO form the published
    lines carry. PostgreSQL reads it as a ``timestamptz`` in UTC."""
    if isinstance(ts, float):
        # A unix time: its second's text made once (a run prints many lines a second), the
        # microseconds rounded as ``datetime.fromtimestamp`` rounds them.
        whole = math.floor(ts)
        micro = round((ts - whole) * 1e6)
        if micro >= 1_000_000:
            whole, micro = whole + 1, micro - 1_000_000
        second = second_text(whole)
        return f"{second}.{micro:06d}" if micro else second
    if ts.tzinfo is not UTC:
        ts = ts.astimezone(UTC)
    return ts.isoformat(" ")[:-6]  # less its "+00:00": one C call, not a replace() and a str()


@lru_cache(maxsize=64)
def second_text(unix_second: int) -> str:
    return datetime.fromtimestamp(unix_second, tz=UTC).isoformat(" ")[:-6]


COLUMNS = "job_id, stream, attempt, seq, line_no, ts, text"


def insert_rows(table: str, rows: list[tuple]) -> None:
    """Insert log rows (the columns of ``COLUMNS``, ``ts`` as ``utc_stamp`` text): PostgreSQL
    takes them with one ``COPY`` (its fastest bulk path), other databases with one ``executemany``."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({COLUMNS}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row((*row[:5], row[5] + "+00:00", row[6]))
        else:
            cursor.executemany(f"INSERT INTO {table} ({COLUMNS}) VALUES (%s, %s, %s, %s, %s, %s, %s)", rows)


# The lines the platform writes where each run starts (the image pull, ckptlib, "environment
# ready", the runner's notes): not counted against a job's cap. A line is one when its text starts
# so and it is among the first PLATFORM_LINES_MAX of its attempt's output (a job printing such
# lines itself gains at most that many a run).
PLATFORM_PREFIXES = ("[console] ", "[INFO] Concurrent Checkpoint library is installed")
PLATFORM_LINES_MAX = 64


def platform_lines(lines: Sequence[RawLine], room: int) -> tuple[int, int]:
    """How many of ``lines`` (sorted, past those counted) go in before the cap, ``room`` of the
    command's lines being left, and how many of those are the platform's."""
    free = 0
    for i, line in enumerate(lines):
        if line.line_no > PLATFORM_LINES_MAX:  # no platform line past here: room more of the command's
            return min(room + free, len(lines)), free
        if line.text.startswith(PLATFORM_PREFIXES):
            free += 1
        elif i - free >= room:
            return i, free
    return len(lines), free


def cap_marker(cap: int, dropped: int, tail: int, follow: int) -> str:
    """The marker between a stream's head and its tail: how many lines were dropped there."""
    lines = f"{dropped:,} line{'' if dropped == 1 else 's'}"
    if not tail:
        return (
            f"[log cap] {lines} dropped here (LOG_MAX_LINES_PER_JOB: a job's log keeps its first {cap:,} lines; "
            "LOG_TAIL_LINES is 0: no last lines); the run goes on"
        )
    return (
        f"[log cap] {lines} dropped here (LOG_MAX_LINES_PER_JOB: a job's log keeps its first {cap:,} lines, "
        f"then each stream's last {tail:,}, LOG_TAIL_LINES); the last {follow:,} follow"
    )


def locked_volume(job_id: int) -> LogVolume:
    """The job's ``LogVolume`` row, locked for the transaction (made on its first line). Read and
    written by hand (``logs.queries.read_volume``, ``save_volume``): the ORM's query and save cost
    a batch of a hundred lines a fifth of its time."""
    volume = read_volume(job_id)
    if volume is None:
        # Jobs whose lines predate the counter: counted once.
        count = stored_line_count(job_id)
        LogVolume.objects.get_or_create(job_id=job_id, defaults={"lines": count, "head": count})
        volume = read_volume(job_id)
        assert volume is not None
    return volume


def save_volume(volume: LogVolume, fields: Sequence[str]) -> None:
    """``volume.save(update_fields=fields)``, written by hand as ``read_volume`` reads."""
    sets = ", ".join(f"{connection.ops.quote_name(name)} = %s" for name in fields)
    values = [volume_field(name).get_db_prep_save(getattr(volume, name), connection) for name in fields]
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {connection.ops.quote_name(LogVolume._meta.db_table)} SET {sets} WHERE id = %s", [*values, volume.pk])


def apply_log_cap(
    volume: LogVolume, stream: str, attempt: int, fresh: list[RawLine], *, next_seq: int, late: bool = False
) -> tuple[list[RawLine], list[RawLine]]:
    """The rows to store from ``fresh`` (sorted by line number; at ``next_seq`` on) under the job's
    cap, and the lines counted for the first time (stored or dropped).

    Delivery is at least once, so a line is counted once: ``volume.seen`` holds the last line
    number of each stream's attempt counted so far (lines stored before it kept that, once read
    from the rows), and only lines past it count. The job's *head* is its first
    LOG_MAX_LINES_PER_JOB lines of its commands' output (the platform's own lines not counted:
    ``platform_lines``), every stream and attempt. The first time a stream passes it, a marker
    line follows its head; after the marker each stream keeps its *tail*, a rolling window of its
    last LOG_TAIL_LINES lines (the oldest rows deleted as new ones come), so the end of a run (its
    traceback, its last checkpoint, a fatal GPU error: what the failover verdict reads) is always
    stored. The marker says how many lines were dropped between head and tail, counted by line
    number (lines the node's runner dropped, their numbers skipped, count too), and is updated by
    each batch. A late batch past the cap (an attempt a later one already follows) is counted and
    dropped. The counts live in the job's ``LogVolume`` row (locked for the batch, saved by the
    caller), never in a count of rows. ``late``: the batch goes at ``next_seq``, before the rows
    of later attempts (else at the stream's end).
    """
    cap, keep = settings.LOG_MAX_LINES_PER_JOB, max(settings.LOG_TAIL_LINES, 0)
    job_id = volume.job_id
    key = f"{stream}/{attempt}"
    if key not in volume.seen:
        volume.seen[key] = last_line_no(job_id, stream, attempt) or 0
    before = volume.seen[key]
    counted = fresh[bisect_right(fresh, before, key=LINE_NO) :]
    if not counted:
        return [], []
    volume.seen[key] = counted[-1].line_no
    rows: list[RawLine] = []
    tail = volume.tails.get(stream)
    new_marker = stream not in volume.markers
    if new_marker:
        split, free = platform_lines(counted, max(cap - volume.head, 0))
        rows, over = counted[:split], counted[split:]
        volume.head += split - free
        if not over:
            volume.lines += len(rows)
            return rows, counted
        # The stream passes the cap: its marker follows what fits (the stream's tail, after it;
        # for a late batch, after the rows of the attempts that follow it).
        volume.markers[stream] = next_seq + len(rows)
        start = (last_seq(job_id, stream) if late else next_seq - 1) + len(rows) + 2
        tail = volume.tails[stream] = {"past": 0, "from": start, "rows": 0, "first": None, "dropped": 0}
        last_kept = rows[-1].line_no if rows else before
        rows.append(RawLine(last_kept, over[0].ts, ""))  # the marker; its text below
    else:
        over, last_kept = counted, before
        if tail is None:  # a stream capped before tails were kept: its tail starts now
            start = last_seq(job_id, stream) + 1 if late else next_seq
            tail = volume.tails[stream] = {"past": 0, "from": start, "rows": 0, "first": None, "dropped": 0}
    tail["past"] += over[-1].line_no - last_kept
    if late:  # dropped: counted below even where their attempt's numbers lie within the tail
        tail.setdefault("late", {})
        tail["late"][str(attempt)] = tail["late"].get(str(attempt), 0) + over[-1].line_no - last_kept
    added = [] if late or not keep else over[-keep:]
    trimmed = max(tail["rows"] + len(added) - keep, 0)
    if trimmed:
        table = connection.ops.quote_name(LogLine._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(
                f"DELETE FROM {table} WHERE job_id = %s AND stream = %s AND seq >= %s AND seq < %s", [job_id, stream, tail["from"], tail["from"] + trimmed]
            )
    if trimmed < tail["rows"]:
        if trimmed:
            tail["first"] = line_at(job_id, stream, tail["from"] + trimmed)
    else:
        tail["first"] = [attempt, added[0].line_no] if added else None
    tail["from"] += trimmed
    tail["rows"] += len(added) - trimmed
    dropped = max(tail["past"] - tail_span(volume.seen, stream, tail["first"], tail.get("late", {})), 0)
    volume.dropped += dropped - tail["dropped"]
    tail["dropped"] = dropped
    text = cap_marker(cap, dropped, keep, tail["rows"])
    if new_marker:
        rows[-1] = rows[-1]._replace(text=text)
    else:
        LogLine.objects.filter(job_id=job_id, stream=stream, seq=volume.markers[stream]).update(text=text)
    rows += added
    volume.lines += len(rows) - trimmed
    return rows, counted


def tail_span(seen: dict[str, int], stream: str, first: list[int] | None, late: dict[str, int]) -> int:
    """How many line numbers the stream's tail covers: from its first row (``first``: attempt,
    line number) to the last line counted, across the attempts after it; less those of late
    batches (``late``: attempt → numbers), which were dropped."""
    if first is None:
        return 0
    attempt, line_no = first
    span = seen.get(f"{stream}/{attempt}", line_no - 1) - line_no + 1
    prefix = f"{stream}/"
    span += sum(last for key, last in seen.items() if key.startswith(prefix) and int(key[len(prefix) :]) > attempt)
    return span - sum(count for number, count in late.items() if int(number) >= attempt)


def purge_old_lines(max_age_days: float) -> int:
    """Delete lines older than the operators' maximum age (0 keeps every line)."""
    if max_age_days <= 0:
        return 0
    deleted, _ = LogLine.objects.filter(ts__lt=timezone.now() - timedelta(days=max_age_days)).delete()
    return deleted
