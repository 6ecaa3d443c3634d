"""What a user (or an operator) may do to a job: stop it, resume it, delete it."""

from __future__ import annotations

import logging

from django.db import transaction

from jobs.models import TrainingJob
from jobs.realtime import job_group, jobs_group, publish
from jobs.services import wakeups
from jobs.services.creation import JobSettingsRefused, check_settings
from jobs.services.lifecycle import transition
from jobs.services.messages import request_placement, wake_agents
from jobs.services.paths import remove_job_files_of
from jobs.services.placement import abandon_open_attempts
from jobs.statuses import DELETABLE, RESUMABLE, STOPPABLE, JobStatus

logger = logging.getLogger(__name__)


class JobActionRefused(Exception):
    """A user action that the job's current status does not allow; the message says why."""


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
                wake_agents(jobs=[job.pk])  # its agents deliver the SIGTERM now
                return JobStatus.STOPPING
        elif transition(job.pk, JobStatus.STOPPED, reason=reason, actor=actor, expected={job.status}):
            # Release whatever a placement still holds now that the job has left the queue.
            abandon_open_attempts(job.pk, cause=reason)
            wakeups.round_wanted()  # its GPUs are free for the next job now
            return JobStatus.STOPPED
    raise JobActionRefused("The job changed status while stopping it; try again.")


# The settings a resumed job runs with that ``check_settings`` judges (its command and secrets
# were judged when it was created and are not changed by a resume).
RESUME_CHECKED = ("project", "gpus_per_node", "node_count", "output_dir", "cpu_limit", "memory_limit_mb")


def resume_job(job: TrainingJob, *, actor: str, checkpoint_step: int | None) -> None:
    """Resume a Stopped, Failed or ``Pending - internalerror`` job from its last committed checkpoint.

    The job goes back to Pending; its next attempt (number n+1) starts with ``CKPT_LAST_STEP``
    set from the checkpoint the node finds in the job's work or output directory, as after a failover. The
    caller names the committed checkpoint step it saw (None: there is none, so nothing to resume).
    """
    if checkpoint_step is None:
        raise JobActionRefused("The job has no committed checkpoint to resume from; clone it to start again.")
    try:
        # What a new job with these settings would be refused (a project's network switched
        # off since, a node set that shrank, an output directory behind a new symlink).
        check_settings({name: getattr(job, name) for name in RESUME_CHECKED}, owner=job.owner)
    except JobSettingsRefused as exc:
        raise JobActionRefused(f"The job cannot resume: {exc}") from None
    if not transition(
        job.pk,
        JobStatus.PENDING,
        expected=RESUMABLE,
        actor=actor,
        finished_at=None,
        reason=f"resumed by {actor} from checkpoint step {checkpoint_step}",
    ):
        job.refresh_from_db(fields=["status"])
        raise JobActionRefused(f"A job that is {job.status} cannot be resumed; only a Stopped, Failed or Pending - internalerror one.")
    request_placement()


def delete_job(job: TrainingJob) -> None:
    job.refresh_from_db(fields=["status"])
    if job.status not in DELETABLE:
        raise JobActionRefused(f"A job that is {job.status} cannot be deleted; stop it first.")
    job_id, owner_id, project_id = job.pk, job.owner_id, job.project_id
    job.delete()
    wakeups.round_wanted()  # its project's share and the queue's places change
    message = {"type": "job.deleted", "job": job_id, "owner": owner_id, "project": project_id}

    def announce() -> None:
        publish(jobs_group(), message)
        publish(job_group(job_id), message)

    transaction.on_commit(announce)
    # After the row: a failed delete keeps the files; the files go with the job, checkpoints included.
    remove_job_files_of(job_id)
    logger.info("job %s: deleted with its files", job_id)
