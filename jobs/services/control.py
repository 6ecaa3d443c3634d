"""The control round: the registered sweeps (lost nodes, failover judgements left undone, log
purges), jobs left behind by an exit report that failed halfway, then placement. Celery beat
(scale-out), ``manage.py controlplane`` or the embedded loop runs it.

The embedded loop runs it when woken (``jobs.services.wakeups``) and at its next timed work, which
each round returns (``Round.next_due``): an image pull's retry time, a job reaching the reservation
bound, a Spot or yield hold running out, a closed attempt's grace, and what the hooks name (a
heartbeat going stale, a failover's repair wait). A job's max run time is its agent's to time."""

from __future__ import annotations

import time
from contextlib import nullcontext
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Min, Q
from django.utils import timezone

from jobs.extensions import extensions
from jobs.models import JobAttempt, Node, TrainingJob
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import CLOSE_GRACE, finish_closed_attempts
from jobs.statuses import WAITING, JobStatus

# Rounds that go on after a full window was placed whole look this many times as far: capacity
# was plentiful, and a round's fixed cost (reading the fleet, the queue, the shares) is then
# shared by more placements. Fair share still orders the jobs within each round.
WIDER_WINDOW = 5


class Round(list):
    """The attempts one control round placed, and ``next_due``: the unix time of its earliest
    timed work (None: none known; scale-out rounds run every second and leave it None)."""

    def __init__(self, attempts=(), *, next_due: float | None = None) -> None:
        super().__init__(attempts)
        self.next_due = next_due


def control_round() -> Round:
    """One round; returns the attempts placed.

    A placement round looks at each project's first ``QUEUE_WINDOW`` jobs of a shape. When it
    placed such a full window whole, the jobs behind it may fit now: placement goes on at once,
    round after round (looking ``WIDER_WINDOW`` times as far), until a round leaves nothing more
    or ``QUEUE_ROUND_BUDGET`` seconds have passed (a round started runs to its end), rather than
    a window per beat. Each round commits on its own, so its launches leave at once."""
    # Closed attempts whose job did not move on are moved first, so the hooks (Job Failover's
    # judge) see their exits in this same round.
    finish_closed_attempts()
    dues = [hook() for hook in extensions.control_round_hooks]
    deadline = time.monotonic() + settings.QUEUE_ROUND_BUDGET
    placed = place_waiting_jobs()
    attempts = list(placed)
    while getattr(placed, "more", False) and time.monotonic() < deadline:
        placed = place_waiting_jobs(window=settings.QUEUE_WINDOW * WIDER_WINDOW)
        attempts += placed
    if timed_rounds():
        dues.append(next_timed_work())
    return Round(attempts, next_due=earliest(dues))


def timed_rounds() -> bool:
    """Whether rounds are timed by their work (the embedded loop with wake-ups), so it is read:
    scale-out's rounds run every second, as do the fixed schedule's (``CONTROL_WAKEUPS=0``)."""
    return settings.CONTROL_WAKEUPS and not settings.SCALE_OUT


def earliest(times: list[float | None]) -> float | None:
    return min((t for t in times if t is not None), default=None)


def postgres_transaction():
    """One transaction for a few short statements (PostgreSQL: one transaction, not one per
    statement). On SQLite each stays on its own: a transaction there takes the write lock at BEGIN
    (IMMEDIATE), so reads grouped in one would queue behind every writer and hold the others up,
    and the embedded default's cost is not per transaction."""
    return nullcontext() if connection.vendor == "sqlite" else transaction.atomic()


def unix(moment: datetime | None, after: timedelta = timedelta(0)) -> float | None:
    return None if moment is None else (moment + after).timestamp()


def next_timed_work() -> float | None:
    """When the queue's answer next changes with no event to announce it: a back-off's retry
    time, the oldest waiting job reaching ``QUEUE_RESERVE_AFTER``, a node's Spot hold or a yielded
    job's hold running out, a closed attempt's ``CLOSE_GRACE`` (``finish_closed_attempts``). Only
    moments still ahead: one past that the round left alone waits for a wake or the safety sweep
    (a moment behind would make the loop spin). Three reads, one transaction on PostgreSQL."""
    now = timezone.now()
    reserve = timedelta(seconds=settings.QUEUE_RESERVE_AFTER)
    yield_hold = timedelta(seconds=settings.QUEUE_YIELD_HOLD)
    with postgres_transaction():
        jobs = TrainingJob.objects.filter(status__in=[JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF]).aggregate(
            retry=Min("next_retry_at", filter=Q(status=JobStatus.IMAGE_PULL_BACKOFF, next_retry_at__gt=now)),
            bound=Min("created_at", filter=Q(created_at__gt=now - reserve, gpus_per_node__gt=0)),
        )
        spot = Node.objects.filter(spot_reclaimed_until__gt=now).aggregate(until=Min("spot_reclaimed_until"))
        ended = JobAttempt.objects.filter(ended_at__gt=now - max(CLOSE_GRACE, yield_hold)).aggregate(
            closed=Min(
                "ended_at",
                filter=Q(state=JobAttempt.State.EXITED, ended_at__gt=now - CLOSE_GRACE, job__status__in=[JobStatus.RUNNING, JobStatus.STOPPING]),
            ),
            yielded=Min("ended_at", filter=Q(preempted_for__status__in=WAITING, ended_at__gt=now - yield_hold)),
        )
    return earliest(
        [
            unix(jobs["retry"]),
            unix(jobs["bound"], reserve),
            unix(spot["until"]),
            unix(ended["closed"], CLOSE_GRACE),
            unix(ended["yielded"], yield_hold),
        ]
    )
