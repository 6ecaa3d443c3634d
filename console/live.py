"""What the live pages show of a job: one JSON snapshot per job, for the socket and catch-up fetch.

A snapshot carries everything a list row or the detail header needs: the status with its badge
group and icon, the reason, failover attempts ``n/max``, the start and finish times, the running
time (``ran_seconds``, and ``running_since`` while the job is Running: the browser counts on from
it, and stands still otherwise) and the progress the log told.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Max
from django.utils import timezone

from jobs.models import TrainingJob, run_clock_of
from jobs.statuses import BADGE_GROUPS, STOPPABLE, TERMINAL
from logs.models import Checkpoint, JobProgress
from logs.progress import progress_payload

SNAPSHOT_FIELDS = ("pk", "status", "status_reason", "failover_count", "started_at", "finished_at", "run_ended", "run_open_since")
# A catch-up fetch names at most this many jobs (a list page holds at most 100).
MAX_SNAPSHOTS = 200


def iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def snapshots(jobs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Snapshots of job rows (``with_run_time().values(*SNAPSHOT_FIELDS)``), with their progress: three queries."""
    rows = list(jobs)
    now = timezone.now()
    ids = [row["pk"] for row in rows]
    progress = {p.job_id: p for p in JobProgress.objects.filter(job_id__in=ids)}
    last_checkpoint: dict[int, datetime] = dict(
        Checkpoint.objects.filter(job_id__in=ids).order_by().values("job_id").annotate(last=Max("committed_at")).values_list("job_id", "last")
    )
    return [snapshot(row, progress.get(row["pk"]), last_checkpoint.get(row["pk"]), now) for row in rows]


def snapshot(row: dict[str, Any], progress: JobProgress | None, last_checkpoint: datetime | None, now: datetime) -> dict[str, Any]:
    group, icon = BADGE_GROUPS.get(row["status"], ("pending", "clock"))
    clock = run_clock_of(status=row["status"], finished_at=row["finished_at"], ended=row["run_ended"], open_since=row["run_open_since"], now=now)
    return {
        "id": row["pk"],
        "status": row["status"],
        "badge": group,
        "icon": icon,
        "reason": row["status_reason"],
        "failover_count": row["failover_count"],
        "max_failovers": settings.MAX_FAILOVERS,
        "started_at": iso(row["started_at"]),
        "finished_at": iso(row["finished_at"]),
        "ran_seconds": None if clock is None else clock.ran_seconds,
        "running_since": None if clock is None else iso(clock.running_since),
        "finished": row["status"] in TERMINAL,
        "stoppable": row["status"] in STOPPABLE,
        "progress": progress_payload(progress),
        "last_checkpoint_at": iso(last_checkpoint),
    }


def visible_snapshots(user, job_ids: Iterable[int]) -> list[dict[str, Any]]:
    ids = sorted(set(job_ids))[:MAX_SNAPSHOTS]
    rows = TrainingJob.objects.visible_to(user).filter(pk__in=ids).order_by("pk").with_run_time().values(*SNAPSHOT_FIELDS)
    return snapshots(rows)


def visible_snapshot(user, job_id: int) -> dict[str, Any] | None:
    found = visible_snapshots(user, [job_id])
    return found[0] if found else None


def server_now() -> str:
    return timezone.now().isoformat()
