"""Job metrics from ingested log lines: progress, the loss curve's points and checkpoints.

``record_metrics`` runs inside ``ingest_lines``'s transaction, once per batch: one pass of the
parser over the batch, then a handful of queries whatever the batch size (none at all when no
line says anything about progress). It returns what to publish after commit, if anything.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import F, FloatField, OuterRef, Subquery
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast
from django.utils import timezone

from ckptlib import CommitEvent
from jobs.realtime import job_metrics_group, jobs_group, publish
from logs.models import Checkpoint, JobProgress, MetricPoint
from logs.progress_parser import BatchMetrics, LineMetrics, MetricSample, Progress, fold, parse_lines

logger = logging.getLogger(__name__)

# Progress comes from rank 0's stream: every rank prints the same steps.
PROGRESS_STREAM = "master"
# A job keeps at most about this many loss points: past twice as many, every other one goes.
MAX_POINTS = 2000
# At most this many loss-curve points from one ingested batch.
SAMPLES_PER_BATCH = 50
# The chart gets at most this many points.
CHART_POINTS = 600
# Progress is published at most this often per job (status changes carry it too).
PUBLISH_INTERVAL = 1.0
# What a checkpoint row's columns hold: ranks' byte counts add up to at most a bigint, ranks to a
# small integer (each commit line's values are checked by the parser).
MAX_BIGINT = 2**63 - 1
MAX_RANKS = 32767

_last_published: dict[int, float] = {}
_publish_lock = threading.Lock()


def progress_payload(progress: JobProgress | None) -> dict[str, Any] | None:
    if progress is None:
        return None
    percent = progress.percent
    return {
        "step": progress.step,
        "total": progress.total,
        "epoch": progress.epoch,
        "loss": progress.loss,
        "lr": progress.lr,
        "percent": round(percent, 2) if percent is not None else None,
        "updated_at": progress.updated_at.isoformat(),
    }


def checkpoint_payload(checkpoint: Checkpoint) -> dict[str, Any]:
    return {
        "attempt": checkpoint.attempt,
        "step": checkpoint.step,
        "bytes": checkpoint.bytes,
        "blocking_s": checkpoint.blocking_s,
        "persist_s": checkpoint.persist_s,
        "ranks": checkpoint.ranks,
        "path": checkpoint.path,
        "committed_at": checkpoint.committed_at.isoformat(),
    }


def record_metrics(*, job_id: int, stream: str, attempt: int, lines: Sequence[tuple[datetime | float, str]]) -> dict[str, Any] | None:
    """Fold a stored batch into the job's progress, points and checkpoints. A line's time is an
    aware datetime or a unix time (``logs.services.RawLine``).

    Returns the ``job.progress`` message to publish after commit, or None when the batch told
    nothing new (or it is too soon after the last one and no checkpoint came). Metrics never cost
    the log its lines: a failure here is logged and rolled back to a savepoint, the lines stay.
    """
    try:
        # Times made datetimes for the lines that told something only (a few of a flood's batch).
        parsed = [(as_datetime(ts), told) for ts, told in parse_lines(lines)]
    except Exception:
        logger.exception("job %s: could not read progress from a batch of %d lines", job_id, len(lines))
        return None
    if not parsed:
        return None
    try:
        with transaction.atomic():
            return store_metrics(job_id, stream, attempt, parsed)
    except Exception:
        logger.exception("job %s: could not store progress", job_id)
        return None


def as_datetime(ts: datetime | float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC) if isinstance(ts, float) else ts


def store_metrics(job_id: int, stream: str, attempt: int, parsed: list[tuple[datetime, LineMetrics]]) -> dict[str, Any] | None:
    current = read_progress(job_id) if stream == PROGRESS_STREAM else None
    start = Progress(step=current.step, total=current.total, epoch=current.epoch, loss=current.loss, lr=current.lr) if current is not None else None
    batch = fold(parsed, start=start)
    if not batch.changed:
        return None
    if stream != PROGRESS_STREAM:
        # Other ranks' streams count for their checkpoints only.
        batch.samples = []
        batch.progress = start or Progress()
    else:
        current = save_progress(job_id, current, batch)
    new_checkpoints = save_checkpoints(job_id, attempt, batch.checkpoints) if batch.checkpoints else []
    if not should_publish(job_id, force=bool(new_checkpoints)):
        return None
    if current is None:
        current = read_progress(job_id)
    return {
        "type": "job.progress",
        "job": job_id,
        "progress": progress_payload(current),
        "checkpoints": [checkpoint_payload(c) for c in new_checkpoints],
    }


def save_progress(job_id: int, current: JobProgress | None, batch: BatchMetrics) -> JobProgress:
    now = timezone.now()
    told = batch.progress
    if current is None:
        current = JobProgress(job_id=job_id, updated_at=now)
    current.step, current.total, current.epoch, current.loss, current.lr = told.step, told.total, told.epoch, told.loss, told.lr
    current.updated_at = now
    samples = batch.samples
    if len(samples) > SAMPLES_PER_BATCH:
        # A chatty run prints a loss every step: an even subset (the last one kept) draws the same curve.
        stride = len(samples) / SAMPLES_PER_BATCH
        samples = [samples[int(i * stride)] for i in range(SAMPLES_PER_BATCH - 1)] + [samples[-1]]
    if samples:
        upsert_points(job_id, samples)
        # Counted as added even when a step was replaced: the count only decides when to thin.
        current.points += len(samples)
        if current.points > 2 * MAX_POINTS:
            current.points = thin_points(job_id)
    if current.pk is None:
        current.save()
    else:
        write_progress(current)
    return current


PROGRESS_COLUMNS = ("id", "step", "total", "epoch", "loss", "lr", "points", "updated_at")


def read_progress(job_id: int) -> JobProgress | None:
    """The job's progress row, read by hand (``write_progress`` writes it): once per batch with
    progress, where the ORM's query and save cost more than the lines' own insert."""
    table = connection.ops.quote_name(JobProgress._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(PROGRESS_COLUMNS)} FROM {table} WHERE job_id = %s", [job_id])
        row = cursor.fetchone()
    if row is None:
        return None
    pk, *values, updated_at = row
    if isinstance(updated_at, str):  # SQLite's text, in UTC (what Django's converter reads)
        updated_at = datetime.fromisoformat(updated_at).replace(tzinfo=UTC)
    # from_db takes the values in the model's field order: id, job, then the others.
    return JobProgress.from_db(connection.alias, ["id", "job_id", *PROGRESS_COLUMNS[1:]], [pk, job_id, *values, updated_at])


def write_progress(current: JobProgress) -> None:
    table = connection.ops.quote_name(JobProgress._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET step = %s, total = %s, epoch = %s, loss = %s, lr = %s, points = %s, updated_at = %s WHERE id = %s",
            [
                current.step,
                current.total,
                current.epoch,
                current.loss,
                current.lr,
                current.points,
                connection.ops.adapt_datetimefield_value(current.updated_at),
                current.pk,
            ],
        )


def upsert_points(job_id: int, samples: Sequence[MetricSample]) -> None:
    """Store a batch's points, a step already stored merged: one multi-row ``INSERT … ON
    CONFLICT`` statement (SQLite and PostgreSQL alike; one round trip), written by hand: the ORM's
    ``bulk_create(update_conflicts=…)`` spent ~3 ms a batch compiling 50 rows, a third of what
    storing 1,000 lines costs. A value the new point does not tell keeps the stored one (an
    evaluation's eval_loss lands beside the step's training loss); a step given twice in the batch
    is one point already (``fold``)."""
    table = connection.ops.quote_name(MetricPoint._meta.db_table)
    stamp = connection.ops.adapt_datetimefield_value
    rows = {s.step: (job_id, s.step, s.epoch, s.loss, s.lr, json.dumps(s.values, allow_nan=False), stamp(s.ts)) for s in samples}
    postgres = connection.vendor == "postgresql"
    values = ", ".join([f"(%s, %s, %s, %s, %s, {'CAST(%s AS jsonb)' if postgres else '%s'}, %s)"] * len(rows))
    # The stored values with the new ones over them: SQLite's json_patch, PostgreSQL's jsonb ||.
    merged = f'{table}."values" || excluded."values"' if postgres else f'json_patch({table}."values", excluded."values")'
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {table} (job_id, step, epoch, loss, lr, "values", ts) VALUES {values} '
            f"ON CONFLICT (job_id, step) DO UPDATE SET epoch = COALESCE(excluded.epoch, {table}.epoch), "
            f"loss = COALESCE(excluded.loss, {table}.loss), lr = COALESCE(excluded.lr, {table}.lr), "
            f'"values" = {merged}, ts = excluded.ts',
            [value for row in rows.values() for value in row],
        )


def thin_points(job_id: int) -> int:
    """Drop every other point of a job's curve (its first and last stay); returns how many are left."""
    ids = list(MetricPoint.objects.filter(job_id=job_id).order_by("step").values_list("pk", flat=True))
    doomed = ids[1:-1:2]
    MetricPoint.objects.filter(pk__in=doomed).delete()
    return len(ids) - len(doomed)


def save_checkpoints(job_id: int, attempt: int, records: list[tuple[CommitEvent, datetime]]) -> list[Checkpoint]:
    """Store commit lines; ranks committing the same step add up into one row."""
    by_step: dict[int, Checkpoint] = {c.step: c for c in Checkpoint.objects.filter(job_id=job_id, attempt=attempt, step__in={r.step for r, _ in records})}
    fresh: dict[int, Checkpoint] = {}
    touched: dict[int, Checkpoint] = {}
    for record, ts in records:
        row = by_step.get(record.step) or fresh.get(record.step)
        if row is None:
            fresh[record.step] = Checkpoint(
                job_id=job_id,
                attempt=attempt,
                step=record.step,
                bytes=record.bytes,
                blocking_s=record.blocking_s,
                persist_s=record.persist_s,
                ranks=1,
                path=record.path[:1000],
                committed_at=ts,
            )
            continue
        row.bytes = min(row.bytes + record.bytes, MAX_BIGINT)
        row.blocking_s = max(row.blocking_s, record.blocking_s)
        row.persist_s = max(row.persist_s, record.persist_s)
        row.ranks = min(row.ranks + 1, MAX_RANKS)
        row.committed_at = max(row.committed_at, ts)
        if row.pk:
            touched[row.step] = row
    if fresh:
        Checkpoint.objects.bulk_create(fresh.values())
    if touched:
        Checkpoint.objects.bulk_update(touched.values(), ["bytes", "blocking_s", "persist_s", "ranks", "committed_at"])
    return sorted([*fresh.values(), *touched.values()], key=lambda c: c.step)


def should_publish(job_id: int, *, force: bool = False) -> bool:
    now = time.monotonic()
    with _publish_lock:
        last = _last_published.get(job_id)
        if not force and last is not None and now - last < PUBLISH_INTERVAL:
            return False
        _last_published[job_id] = now
        if len(_last_published) > 10_000:
            _last_published.clear()
    return True


def chart_points(job_id: int, *, limit: int = CHART_POINTS) -> list[dict[str, Any]]:
    """The job's curves for the chart, evenly thinned to at most ``limit`` points: each point's
    step, loss, learning rate, epoch and its other numbers (``values``)."""
    rows = list(MetricPoint.objects.filter(job_id=job_id).order_by("step").values_list("step", "loss", "lr", "epoch", "values"))
    if len(rows) > limit:
        # Points that carry a metric few points have (an evaluation's) are kept: thinning the
        # eval curve of a run that evaluates every 500 steps would leave it nothing to draw.
        seen: dict[str, int] = {}
        for row in rows:
            for name in row[4] or ():
                seen[name] = seen.get(name, 0) + 1
        few = {name for name, times in seen.items() if times <= limit // 4}
        rare = [i for i, row in enumerate(rows) if row[4] and few.intersection(row[4])]
        stride = len(rows) / limit
        picked = {int(i * stride) for i in range(limit - 1)} | set(rare[:limit]) | {len(rows) - 1}
        rows = [rows[i] for i in sorted(picked)]
    return [{"step": s, "loss": loss, "lr": lr, "epoch": epoch, "values": values or {}} for s, loss, lr, epoch, values in rows]


def metric_names(points: Sequence[dict[str, Any]]) -> list[str]:
    """The metrics the points tell, loss first, then the others by name."""
    names = {name for point in points for name in point.get("values") or {}}
    return (["loss"] if any(p.get("loss") is not None for p in points) else []) + sorted(names)


def publish_progress(job_id: int, message: dict[str, Any]) -> None:
    """To the list pages and the job's own pages; called after commit."""
    publish(job_metrics_group(job_id), message)
    publish(jobs_group(), message)


def last_value(metric: str) -> Subquery:
    """For annotating jobs: the value of ``metric`` (``loss`` or a name in a point's values) at
    the newest step that logged it; null where none did."""
    points = MetricPoint.objects.filter(job=OuterRef("pk"))
    value: F | Cast
    if metric == "loss":
        points, value = points.filter(loss__isnull=False), F("loss")
    else:
        points, value = points.filter(values__has_key=metric), Cast(KeyTextTransform(metric, "values"), FloatField())
    return Subquery(points.order_by("-step").annotate(last=value).values("last")[:1], output_field=FloatField())
