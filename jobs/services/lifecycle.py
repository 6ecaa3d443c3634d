"""The one place a Training Job's status changes, and the user commands built on it."""
from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs.models import JobEvent, TrainingJob
from jobs.realtime import job_group, jobs_group, publish
from jobs.statuses import DELETABLE, STOPPABLE, TERMINAL, JobStatus, sources_of

logger = logging.getLogger(__name__)


class TransitionRefused(Exception):
    """The job was not in a status from which the requested one may be entered."""


class JobActionRefused(Exception):
    """A user action that the job's current status does not allow; the message says why."""


def transition(
    job_id: int,
    to_status: str,
    *,
    reason: str = "",
    actor: str = "system",
    attempt: int | None = None,
    expected: frozenset[str] | set[str] | None = None,
    evidence: dict | None = None,
    **fields: Any,
) -> bool:
    """Move a job to ``to_status`` if the transition table allows it from its current status.

    A compare-and-swap: the update only matches a row whose status is one the table allows into
    ``to_status`` (narrowed to ``expected`` if given), and the event row is written in the same
    transaction. Extra ``fields`` are set on the job in the same update. Returns whether the job
    moved; a concurrent change that got there first makes it return False.
    """
    allowed_from = sources_of(to_status)
    if expected is not None:
        allowed_from = allowed_from & frozenset(expected)
    now = timezone.now()
    updates: dict[str, Any] = {"status": to_status, "status_reason": reason[:500], **fields}
    if to_status in TERMINAL and "finished_at" not in fields:
        updates["finished_at"] = now
    with transaction.atomic():
        from_status = (
            TrainingJob.objects.filter(pk=job_id, status__in=allowed_from).values_list("status", flat=True).first()
        )
        if from_status is None:
            return False
        changed = TrainingJob.objects.filter(pk=job_id, status=from_status).update(**updates)
        if changed != 1:
            return False
        JobEvent.objects.create(
            job_id=job_id,
            from_status=from_status,
            to_status=to_status,
            reason=reason[:500],
            attempt=attempt,
            actor=actor[:150],
            evidence=evidence or {},
            created_at=now,
        )
        message = {"type": "job.status", "job": job_id, "from": from_status, "status": to_status, "reason": reason[:500]}
        transaction.on_commit(lambda: publish_status(job_id, message))
    logger.info("job %s: %s → %s (%s)", job_id, from_status, to_status, reason or "no reason given")
    return True


def publish_status(job_id: int, message: dict) -> None:
    publish(job_group(job_id), message)
    publish(jobs_group(), message)


def record_creation(job: TrainingJob, *, actor: str) -> None:
    JobEvent.objects.create(job=job, from_status="", to_status=job.status, reason="job created", actor=actor[:150])
    logger.info("job %s: created as %s", job.pk, job.status)


def request_stop(job: TrainingJob, *, actor: str, reason: str = "stopped by user") -> str:
    """Stop a job: one that has no process goes straight to Stopped, a running one to Stopping.

    The node agent sees ``Stopping`` and sends SIGTERM to the run's process group, then SIGKILL
    after the grace period. Returns the new status; raises JobActionRefused if it cannot stop.
    """
    for _ in range(3):
        job.refresh_from_db(fields=["status"])
        if job.status not in STOPPABLE:
            raise JobActionRefused(f"A job that is {job.status} cannot be stopped.")
        if job.status == JobStatus.RUNNING:
            if transition(job.pk, JobStatus.STOPPING, reason=reason, actor=actor, expected={JobStatus.RUNNING}):
                return JobStatus.STOPPING
        else:
            # Release whatever a placement still holds before the job leaves the queue.
            from jobs.services.placement import abandon_open_attempts

            if transition(job.pk, JobStatus.STOPPED, reason=reason, actor=actor, expected={job.status}):
                abandon_open_attempts(job.pk, cause=reason)
                return JobStatus.STOPPED
    raise JobActionRefused("The job changed status while stopping it; try again.")


def delete_job(job: TrainingJob) -> None:
    job.refresh_from_db(fields=["status"])
    if job.status not in DELETABLE:
        raise JobActionRefused(f"A job that is {job.status} cannot be deleted; stop it first.")
    job.delete()
    logger.info("job %s: deleted", job.pk)
