"""The one table from how an attempt's run ended to where its job goes, for every engine.

``outcome`` reads the end's kind (``jobs.backends.facts.EndKind``) and the job's situation: is the
job being stopped, was the attempt reclaimed (a Spot run yielding its GPUs), its exit code, is Job
Failover on. It returns the job's next status, the reason as a template, and whether Job Failover
judges the end (then the status is the judge's to choose). ``jobs.services.runs`` fills the
template in: ``{cause}`` the end's words (``facts.describe``), ``{stopped}`` the stop's reason,
``{yielded}`` why the run gave its GPUs back, ``{detail}`` the end's own detail. Pure: no database,
no settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from jobs.backends.facts import EndKind
from jobs.statuses import JobStatus


@dataclass(frozen=True)
class Outcome:
    """Where the job goes. ``judge``: Job Failover decides (its handler moves the job; ``status``
    and ``reason`` hold only where no handler is registered); ``lost``: the node itself was lost,
    said to the judge."""

    status: str
    reason: str
    judge: bool = False
    lost: bool = False


STOPPED = Outcome(JobStatus.STOPPED, "{stopped}; {cause}")
YIELDED = Outcome(JobStatus.PENDING, "{yielded}; {cause}")  # back in the queue, never a failover
COMPLETED = Outcome(JobStatus.COMPLETED, "exit code 0")
JUDGED = Outcome(JobStatus.FAILOVER_IN_PROGRESS, "{cause}", judge=True)
FAILOVER_OFF = Outcome(JobStatus.FAILED, "{cause}; Job Failover is off")
LAUNCH_FAILED = Outcome(JobStatus.FAILED, "could not start the run: {detail}")  # the platform's fault: never "read the logs"

# A Running job's attempt ended (not being stopped, not reclaimed): one row per kind.
WHILE_RUNNING: Mapping[EndKind, Outcome] = {
    EndKind.EXITED: JUDGED,  # exit code 0 is COMPLETED (``outcome``)
    EndKind.SIGNALED: JUDGED,
    # Its own limits, not the hardware: Job Failover has nothing to judge.
    EndKind.OUT_OF_MEMORY: Outcome(JobStatus.FAILED, "{cause}; raise the job's memory limit"),
    EndKind.PID_LIMIT: Outcome(JobStatus.FAILED, "{cause}"),
    EndKind.STORAGE_LIMIT: Outcome(JobStatus.FAILED, "{cause}"),
    # The scheduler's backstop of the job's max run time (the console's own stop comes first,
    # ``runs.max_run_time_reached``; this one where the console was not there to stop it).
    EndKind.TIME_LIMIT: Outcome(JobStatus.FAILED, "max run time exceeded: {cause}"),
    EndKind.PREEMPTED: YIELDED,  # its producer marks the attempt reclaimed first (``runs.preempted_by_scheduler``)
    EndKind.NODE_LOST: Outcome(JobStatus.FAILOVER_IN_PROGRESS, "{cause}", judge=True, lost=True),
    EndKind.SUPERVISOR_LOST: JUDGED,
    EndKind.EXIT_UNREADABLE: JUDGED,
    EndKind.HUNG_AFTER_KILL: JUDGED,
    EndKind.CANCELLED: JUDGED,
    EndKind.LAUNCH_FAILED: LAUNCH_FAILED,
    EndKind.ABANDONED: JUDGED,
}


def outcome(kind: EndKind, *, stopping: bool, reclaimed: bool, exit_code: int | None, failover_on: bool) -> Outcome:
    """Where a job goes when its attempt ended as ``kind``: a job being stopped is Stopped, a
    launch that failed is Failed, a reclaimed attempt's job is Pending again, exit 0 is Completed;
    otherwise the kind's row, judged by Job Failover when it is on."""
    if stopping:
        return STOPPED
    if kind is EndKind.LAUNCH_FAILED:
        return LAUNCH_FAILED
    if reclaimed:
        return YIELDED
    if kind is EndKind.EXITED and exit_code == 0:
        return COMPLETED
    row = WHILE_RUNNING[kind]
    if row.judge and not failover_on:
        return FAILOVER_OFF
    return row
