"""What happens to a job when its run starts and when it ends."""
from __future__ import annotations

import logging
import signal as signals

from django.db import transaction
from django.utils import timezone

from jobs import hooks
from jobs.agent.runtime import request_placement
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


def placement_text(attempt: JobAttempt) -> str:
    return ", ".join(
        f"{p.node.name} GPU {','.join(map(str, p.gpu_indices)) or '-'}" for p in attempt.placements.select_related("node")
    )


def mark_running(attempt: JobAttempt) -> bool:
    """The attempt's processes have started: the job is Running. False if the job moved on."""
    now = timezone.now()
    job = attempt.job
    fields = {} if job.started_at else {"started_at": now}
    reason = f"attempt {attempt.number} running on {placement_text(attempt)}"
    previous = JobAttempt.objects.filter(job=job, number__lt=attempt.number, state=JobAttempt.State.EXITED).order_by("-number").first()
    evidence: dict = {}
    if previous is not None and (previous.verdict == "hardware" or previous.reclaimed):
        nodes = ", ".join(previous.placements.values_list("node__name", flat=True))
        what = "spot capacity reclaimed" if previous.reclaimed else f"a GPU fault: {previous.verdict_reason}"
        reason = f"attempt {attempt.number} on {placement_text(attempt)} after {what} on {nodes}"
        evidence = {"previous_attempt": previous.number, **previous.evidence}
    if attempt.resume_step is not None:
        reason += f"; resuming from checkpoint step {attempt.resume_step}"
    with transaction.atomic():
        JobAttempt.objects.filter(pk=attempt.pk).update(state=JobAttempt.State.RUNNING, started_at=now)
        moved = transition(
            job.pk,
            JobStatus.RUNNING,
            reason=reason,
            actor=AGENT,
            attempt=attempt.number,
            expected={JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF, JobStatus.FAILOVER_IN_PROGRESS},
            evidence=evidence,
            **fields,
        )
        if not moved:
            JobAttempt.objects.filter(pk=attempt.pk).update(stop_requested_at=now)
    return moved


def record_exit(
    attempt: JobAttempt, *, exit_code: int | None, exit_signal: int | None, cause: str = "", lost: bool = False
) -> str:
    """Close the attempt, free its GPUs and move the job to where the exit takes it.

    A job being stopped ends ``Stopped``; a reclaimed Spot run goes back to ``Pending``; exit 0
    ends ``Completed``; any other end of a run is judged by Job Failover when the job has it on
    (``lost``: the node itself was lost), else ends ``Failed``. Returns the job's new status.
    """
    now = timezone.now()
    outcome = cause or describe_exit(exit_code, exit_signal)
    with transaction.atomic():
        updated = JobAttempt.objects.filter(pk=attempt.pk).exclude(state=JobAttempt.State.EXITED).update(
            state=JobAttempt.State.EXITED, ended_at=now, exit_code=exit_code, exit_signal=exit_signal, cause=outcome[:500]
        )
        if updated:
            release_gpus(attempt)
            request_placement()  # the freed GPUs may fit a waiting job
    job = TrainingJob.objects.get(pk=attempt.job_id)
    if not updated:
        return job.status
    attempt.refresh_from_db()
    if job.status == JobStatus.STOPPING:
        to, reason = JobStatus.STOPPED, f"{job.status_reason or 'stopped'}; {outcome}"
    elif job.status != JobStatus.RUNNING:
        logger.warning("job %s: attempt %s ended while the job was %s", job.pk, attempt.number, job.status)
        return job.status
    elif attempt.reclaimed:
        to, reason = JobStatus.PENDING, f"spot capacity reclaimed; {outcome}"
    elif exit_code == 0 and not exit_signal and not cause:
        to, reason = JobStatus.COMPLETED, "exit code 0"
    elif job.failover_enabled and hooks.failed_run_handler is not None:
        return hooks.failed_run_handler(job, attempt, outcome, lost)
    else:
        to, reason = JobStatus.FAILED, outcome if job.failover_enabled else f"{outcome}; Job Failover is off"
    transition(job.pk, to, reason=reason, actor=AGENT, attempt=attempt.number, expected={job.status})
    return to
