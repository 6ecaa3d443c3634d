"""Writing log lines: ingestion of the lines node agents send, and the purge of old ones.
Everything that reads them (ingestion's own reads too) is in ``logs.queries``."""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone
from prometheus_client import Counter

from jobs.realtime import log_group, publish
from logs.models import LogLine, LogVolume
from logs.progress import publish_progress, record_metrics
from logs.queries import last_line_no, last_seq, stored_line_count

logger = logging.getLogger(__name__)

# What a database refuses in text, stored as U+FFFD instead: NUL (PostgreSQL's text columns) and
# lone surrogates (not UTF-8).
UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


# Counted in the process that ingests (the console's embedded agent, or each node agent in
# scale-out, which serves it on its own METRICS_PORT); see docs/metrics.md.
LINES_INGESTED = Counter("satrain_log_lines_ingested_total", "Log lines stored (after dropping lines already stored)")


class RawLine(NamedTuple):
    """A line as the node agent captured it: its number in the attempt's output, time and text."""

    line_no: int
    ts: datetime
    text: str


def ingest_lines(*, job_id: int, stream: str, attempt: int, lines: Sequence[RawLine]) -> list[dict]:
    """Store a batch of lines of one attempt, skipping those already stored.

    Delivery is at least once: a batch may come again after a retry or a restart, so lines whose
    ``line_no`` is not past the last stored one of the attempt are dropped, and ``seq`` continues
    from the stream's last one. The rows go in with one ``executemany`` of plain tuples (the ORM's
    per-object work cost more than the database's). Returns the stored lines as the payloads
    published after commit, in order.
    """
    if not lines:
        return []
    lines = [ln._replace(text=UNSTORABLE.sub("\ufffd", ln.text)) if UNSTORABLE.search(ln.text) else ln for ln in lines]
    table = connection.ops.quote_name(LogLine._meta.db_table)
    with transaction.atomic():
        stored_up_to = last_line_no(job_id, stream, attempt)
        fresh = sorted(lines, key=lambda ln: ln.line_no)
        if stored_up_to is not None:
            fresh = [ln for ln in fresh if ln.line_no > stored_up_to]
        if not fresh:
            return []
        seq = last_seq(job_id, stream)
        fresh, every = apply_log_cap(job_id, stream, attempt, fresh, next_seq=seq + 1)
        adapt = connection.ops.adapt_datetimefield_value
        if fresh:
            with connection.cursor() as cursor:
                cursor.executemany(
                    f"INSERT INTO {table} (job_id, stream, attempt, seq, line_no, ts, text) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                    [(job_id, stream, attempt, seq + i, ln.line_no, adapt(ln.ts), ln.text) for i, ln in enumerate(fresh, start=1)],
                )
        stored = [
            {"seq": seq + i, "attempt": attempt, "ts": ln.ts.isoformat(), "text": ln.text} for i, ln in enumerate(fresh, start=1)
        ]
        payload = {"type": "log.lines", "lines": stored}
        if stored:
            transaction.on_commit(lambda: publish(log_group(job_id, stream), payload))
            transaction.on_commit(lambda: LINES_INGESTED.inc(len(stored)))
        # Progress and checkpoints are read from every line, those past the log cap included.
        progress = record_metrics(job_id=job_id, stream=stream, attempt=attempt, lines=[(ln.ts, ln.text) for ln in every])
        if progress is not None:
            transaction.on_commit(lambda: publish_progress(job_id, progress))
    return stored


def cap_marker(cap: int, dropped: int) -> str:
    return (
        f"[log cap] this job stored its limit of {cap:,} log lines (LOG_MAX_LINES_PER_JOB); "
        f"later lines are counted and dropped ({dropped:,} so far); the run goes on"
    )


def apply_log_cap(
    job_id: int, stream: str, attempt: int, fresh: list[RawLine], *, next_seq: int
) -> tuple[list[RawLine], list[RawLine]]:
    """The lines of ``fresh`` to store under the job's cap of LOG_MAX_LINES_PER_JOB, and those
    counted for the first time (stored or dropped).

    Past the cap, lines are counted and dropped; the first time a stream passes it, a marker line
    takes the place of its first dropped line, and later batches update the marker's count. The
    counts live in the job's ``LogVolume`` row (locked for the batch), never in a count of rows.
    """
    cap = settings.LOG_MAX_LINES_PER_JOB
    volume = LogVolume.objects.select_for_update().filter(job_id=job_id).first()
    if volume is None:
        # Jobs whose lines predate the counter: counted once.
        volume, _ = LogVolume.objects.get_or_create(job_id=job_id, defaults={"lines": stored_line_count(job_id)})
    key = f"{stream}/{attempt}"
    counted = [ln for ln in fresh if ln.line_no > volume.seen.get(key, 0)]
    if not counted:
        return [], []
    room = max(cap - volume.lines, 0)
    kept, over = counted[:room], counted[room:]
    if over:
        # Counted by line number: lines the node's runner already left out past the cap (their
        # numbers skipped) are dropped lines too.
        volume.dropped += over[-1].line_no - (kept[-1].line_no if kept else volume.seen.get(key, 0))
        if stream not in volume.markers:
            volume.markers[stream] = next_seq + len(kept)
            kept.append(over[0]._replace(text=cap_marker(cap, volume.dropped)))
        else:
            LogLine.objects.filter(job_id=job_id, stream=stream, seq=volume.markers[stream]).update(text=cap_marker(cap, volume.dropped))
    volume.lines += len(kept)
    volume.seen[key] = counted[-1].line_no
    volume.save(update_fields=["lines", "dropped", "seen", "markers"])
    return kept, counted


def purge_old_lines(max_age_days: float) -> int:
    """Delete lines older than the operators' maximum age (0 keeps every line)."""
    if max_age_days <= 0:
        return 0
    deleted, _ = LogLine.objects.filter(ts__lt=timezone.now() - timedelta(days=max_age_days)).delete()
    return deleted
