"""Ingestion of log lines sent by node agents."""
from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.db.models import Max

from logs.models import LogLine

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RawLine:
    """A line as the node agent captured it: its number in the attempt's output, time and text."""

    line_no: int
    ts: datetime
    text: str


def ingest_lines(*, job_id: int, stream: str, attempt: int, lines: Sequence[RawLine]) -> list[LogLine]:
    """Store a batch of lines of one attempt, skipping those already stored.

    Delivery is at least once: a batch may come again after a retry or a restart, so lines whose
    ``line_no`` is not past the last stored one of the attempt are dropped, and ``seq`` continues
    from the stream's last one. Returns the lines stored now, in order.
    """
    if not lines:
        return []
    with transaction.atomic():
        stored = LogLine.objects.filter(job_id=job_id, stream=stream)
        last_line_no = stored.filter(attempt=attempt).aggregate(m=Max("line_no"))["m"]
        fresh = [ln for ln in sorted(lines, key=lambda ln: ln.line_no) if last_line_no is None or ln.line_no > last_line_no]
        if not fresh:
            return []
        last_seq = stored.aggregate(m=Max("seq"))["m"] or 0
        rows = [
            LogLine(job_id=job_id, stream=stream, attempt=attempt, seq=last_seq + i, line_no=ln.line_no, ts=ln.ts, text=ln.text)
            for i, ln in enumerate(fresh, start=1)
        ]
        LogLine.objects.bulk_create(rows, batch_size=2000)
    return rows


def lines_of(job_id: int, *, stream: str = "master") -> Iterable[LogLine]:
    return LogLine.objects.filter(job_id=job_id, stream=stream).order_by("seq")
