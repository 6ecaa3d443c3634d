"""Resource samples of a job's runs: stored as the node agent reports them, merged when many.

A job keeps at most ``MAX_SAMPLES`` rows: past that, its oldest ``MERGE_BATCH`` rows are merged
pairwise (means weighted by span, spans added), so older history gets coarser while the recent
part stays at the sampling interval. The agent reports facts; nothing here judges them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from jobs.models import ResourceSample

logger = logging.getLogger(__name__)

MAX_SAMPLES = 600
MERGE_BATCH = 200
FIELDS = ("gpu_util", "gpu_mem_mb", "power_w", "cpu_percent", "host_mem_mb")


@dataclass(frozen=True)
class Reading:
    """One sampling of one job's run on one node (None: not measurable there)."""

    job_id: int
    attempt: int
    ts: datetime
    span_s: float
    gpu_util: float | None = None
    gpu_mem_mb: float | None = None
    power_w: float | None = None
    cpu_percent: float | None = None
    host_mem_mb: float | None = None


def record_readings(readings: list[Reading]) -> None:
    """Store readings (one row each) and merge the history of any job that grew too long."""
    if not readings:
        return
    with transaction.atomic():
        ResourceSample.objects.bulk_create(
            ResourceSample(job_id=r.job_id, attempt=r.attempt, ts=r.ts, span_s=r.span_s, **{f: getattr(r, f) for f in FIELDS}) for r in readings
        )
    for job_id in {r.job_id for r in readings}:
        if ResourceSample.objects.filter(job_id=job_id).count() > MAX_SAMPLES:
            merge_oldest(job_id)


def weighted(a: float | None, wa: float, b: float | None, wb: float) -> float | None:
    if a is None or b is None:
        return a if b is None else b
    total = wa + wb
    return (a * wa + b * wb) / total if total > 0 else (a + b) / 2


def merge_oldest(job_id: int) -> None:
    """Merge the job's oldest ``MERGE_BATCH`` samples pairwise (the same attempt only)."""
    with transaction.atomic():
        rows = list(ResourceSample.objects.select_for_update().filter(job_id=job_id).order_by("ts", "id")[:MERGE_BATCH])
        doomed: list[int] = []
        for first, second in zip(rows[0::2], rows[1::2], strict=False):
            if first.attempt != second.attempt:
                continue
            wa, wb = max(first.span_s, 1e-3), max(second.span_s, 1e-3)
            for name in FIELDS:
                setattr(second, name, weighted(getattr(first, name), wa, getattr(second, name), wb))
            second.span_s = first.span_s + second.span_s
            second.save(update_fields=[*FIELDS, "span_s"])
            doomed.append(first.pk)
        ResourceSample.objects.filter(pk__in=doomed).delete()
    logger.debug("job %s: merged %s resource samples", job_id, len(doomed))


def samples_of(job_id: int) -> list[dict]:
    """A job's samples, oldest first, as the chart and the API give them."""
    rows = ResourceSample.objects.filter(job_id=job_id).order_by("ts", "id").values("attempt", "ts", "span_s", *FIELDS)
    return [{**row, "ts": row["ts"].isoformat()} for row in rows]
