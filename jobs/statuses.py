"""Training Job statuses, the allowed transitions between them, and their named groups.

The texts are exactly those the console shows (and the API's ``status`` field carries).
"""

from __future__ import annotations

from django.db import models


class JobStatus(models.TextChoices):
    PENDING = "Pending", "Pending"  # accepted, waiting for placement or capacity
    RUNNING = "Running", "Running"  # the training process runs on a node
    FAILOVER_IN_PROGRESS = (  # the run stopped; the platform judges the cause or re-places the job
        "Pending - failoverinprogress",
        "Pending - failoverinprogress",
    )
    INTERNAL_ERROR = (  # failover refused: no hardware fault signal; read the logs
        "Pending - internalerror",
        "Pending - internalerror",
    )
    MAX_RETRIES_EXCEEDED = (  # the failover limit is spent; no more re-placement
        "Pending - maxretriesexceeded",
        "Pending - maxretriesexceeded",
    )
    IMAGE_PULL_BACKOFF = (  # the job's image cannot be resolved; retried with backoff
        "Pending - imagepullbackoff",
        "Pending - imagepullbackoff",
    )
    COMPLETED = "Completed", "Completed"  # the command exited 0
    FAILED = "Failed", "Failed"  # the run stopped and failover is off (or the job cannot go on)
    STOPPING = "Stopping", "Stopping"  # the user (or the max run time) asked the run to stop
    STOPPED = "Stopped", "Stopped"  # the run was stopped


S = JobStatus

# from → the statuses it may move to. Anything not listed is refused.
TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.RUNNING, S.IMAGE_PULL_BACKOFF, S.STOPPED, S.FAILED}),
    S.IMAGE_PULL_BACKOFF: frozenset({S.PENDING, S.RUNNING, S.STOPPED}),
    # Running → Pending: a Spot run gave its GPUs back (an operator reclaimed the spot capacity, or
    # the queue preempted it for On-Demand work within quota); never a failover.
    S.RUNNING: frozenset({S.COMPLETED, S.FAILED, S.STOPPING, S.FAILOVER_IN_PROGRESS, S.PENDING}),
    S.STOPPING: frozenset({S.STOPPED}),
    S.FAILOVER_IN_PROGRESS: frozenset({S.RUNNING, S.INTERNAL_ERROR, S.MAX_RETRIES_EXCEEDED, S.IMAGE_PULL_BACKOFF, S.STOPPED, S.FAILED}),
    # → Pending only by the user's Resume (jobs.services.actions.resume_job): a new attempt from
    # the last committed checkpoint.
    S.INTERNAL_ERROR: frozenset({S.PENDING}),
    S.MAX_RETRIES_EXCEEDED: frozenset(),
    S.COMPLETED: frozenset(),
    S.FAILED: frozenset({S.PENDING}),  # the user's Resume, as below
    S.STOPPED: frozenset({S.PENDING}),
}

# Finished: nothing moves these on by itself (a user may Resume a RESUMABLE one).
TERMINAL = frozenset({S.INTERNAL_ERROR, S.MAX_RETRIES_EXCEEDED, S.COMPLETED, S.FAILED, S.STOPPED})
RESUMABLE = frozenset({S.STOPPED, S.INTERNAL_ERROR, S.FAILED})
ACTIVE = frozenset(JobStatus.values) - TERMINAL
# Waiting for a placement: the placement loop looks at these.
WAITING = frozenset({S.PENDING, S.IMAGE_PULL_BACKOFF, S.FAILOVER_IN_PROGRESS})
# A process may be alive on a node.
ON_NODE = frozenset({S.RUNNING, S.STOPPING})
STOPPABLE = frozenset({S.PENDING, S.IMAGE_PULL_BACKOFF, S.RUNNING, S.FAILOVER_IN_PROGRESS})
DELETABLE = TERMINAL


def can_transition(from_status: str, to_status: str) -> bool:
    return to_status in TRANSITIONS.get(from_status, frozenset())


def sources_of(to_status: str) -> frozenset[str]:
    """Every status from which ``to_status`` may be entered."""
    return frozenset(s for s, targets in TRANSITIONS.items() if to_status in targets)


# Badge group per status: the colour class and the icon name the templates use. Status is always
# told by icon and text together, never by colour alone.
BADGE_GROUPS: dict[str, tuple[str, str]] = {
    S.PENDING: ("pending", "clock"),
    S.IMAGE_PULL_BACKOFF: ("warning", "alert"),
    S.RUNNING: ("running", "play"),
    S.STOPPING: ("stopping", "stop"),
    S.FAILOVER_IN_PROGRESS: ("failover", "refresh"),
    S.INTERNAL_ERROR: ("error", "alert"),
    S.MAX_RETRIES_EXCEEDED: ("error", "alert"),
    S.FAILED: ("error", "x"),
    S.COMPLETED: ("success", "check"),
    S.STOPPED: ("stopped", "stop"),
}
