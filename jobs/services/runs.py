"""What happens to a job when its run starts and when it ends."""
from __future__ import annotations

import logging
import signal as signals

from django.db import transaction
from django.utils import timezone

from jobs.models import AttemptNode, JobAttempt, TrainingJob
from jobs.services.lifecycle import transition
from jobs.services.placement import release_gpus
from jobs.statuses import JobStatus

logger = logging.getLogger(__name__)

AGENT = "node-agent"


def describe_exit(exit_code: int | None, exit_signal: int | None) -> str:
    if exit_signal:
        try:
            name = signals.Signals(exit_signal).name
        except ValueError:
            name = f"signal {exit_signal}"
        return f"killed by {name}"
    return f"exit code {exit_code}"


def mark_running(attempt: JobAttempt) -> bool:
    """The attempt's processes have started: the job is Running. False if the job moved on."""
    now = timezone.now()
    job = attempt.job
    fields = {} if job.started_at else {"started_at": now}
    nodes = ", ".join(
        f"{p.node.name} GPU {','.join(map(str, p.gpu_indices)) or '-'}"
        for p in attempt.placements.select_related("node")
    )
    with transaction.atomic():
        JobAttempt.objects.filter(pk=attempt.pk).update(state=JobAttempt.State.RUNNING, started_at=now)
        moved = transition(
            job.pk,
            JobStatus.RUNNING,
            reason=f"attempt {attempt.number} running on {nodes}",
            actor=AGENT,
            attempt=attempt.number,
            expected={JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF, JobStatus.FAILOVER_IN_PROGRESS},
            **fields,
        )
        if not moved:
            JobAttempt.objects.filter(pk=attempt.pk).update(stop_requested_at=now)
    return moved


def record_exit(attempt: JobAttempt, *, exit_code: int | None, exit_signal: int | None, cause: str = "") -> str:
    """Close the attempt, free its GPUs and move the job to where the exit takes it.

    A job being stopped ends ``Stopped``; exit 0 ends ``Completed``; anything else ``Failed``.
    Returns the job's new status.
    """
    now = timezone.now()
    outcome = cause or describe_exit(exit_code, exit_signal)
    with transaction.atomic():
        updated = JobAttempt.objects.filter(pk=attempt.pk).exclude(state=JobAttempt.State.EXITED).update(
            state=JobAttempt.State.EXITED, ended_at=now, exit_code=exit_code, exit_signal=exit_signal, cause=outcome[:500]
        )
        if not updated:
            return TrainingJob.objects.values_list("status", flat=True).get(pk=attempt.job_id)
        release_gpus(attempt)
        job = TrainingJob.objects.get(pk=attempt.job_id)
        if job.status == JobStatus.STOPPING:
            to, reason = JobStatus.STOPPED, f"{job.status_reason or 'stopped'}; {outcome}"
        elif job.status == JobStatus.RUNNING and exit_code == 0 and not exit_signal:
            to, reason = JobStatus.COMPLETED, "exit code 0"
        elif job.status == JobStatus.RUNNING:
            to, reason = JobStatus.FAILED, outcome
        else:
            logger.warning("job %s: attempt %s ended while the job was %s", job.pk, attempt.number, job.status)
            return job.status
        transition(job.pk, to, reason=reason, actor=AGENT, attempt=attempt.number, expected={job.status})
    return to


def placements_on(node_names: list[str]):
    return AttemptNode.objects.filter(node__name__in=node_names).select_related("attempt", "attempt__job", "node")
