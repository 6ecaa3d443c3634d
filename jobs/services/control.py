"""The control round: the registered sweeps (lost nodes, failover judgements left undone, log
purges), jobs left behind by an exit report that failed halfway, then placement. Celery beat
(scale-out), ``manage.py controlplane`` or the embedded loop runs it."""
from __future__ import annotations

import time

from django.conf import settings

from jobs.extensions import extensions
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import finish_closed_attempts

# Rounds that go on after a full window was placed whole look this many times as far: capacity
# was plentiful, and a round's fixed cost (reading the fleet, the queue, the shares) is then
# shared by more placements. Fair share still orders the jobs within each round.
WIDER_WINDOW = 5


def control_round() -> list:
    """One round; returns the attempts placed.

    A placement round looks at each project's first ``QUEUE_WINDOW`` jobs of a shape. When it
    placed such a full window whole, the jobs behind it may fit now: placement goes on at once,
    round after round (looking ``WIDER_WINDOW`` times as far), until a round leaves nothing more
    or ``QUEUE_ROUND_BUDGET`` seconds have passed (a round started runs to its end), rather than
    a window per beat. Each round commits on its own, so its launches leave at once."""
    for hook in extensions.control_round_hooks:
        hook()
    finish_closed_attempts()
    deadline = time.monotonic() + settings.QUEUE_ROUND_BUDGET
    placed = place_waiting_jobs()
    attempts = list(placed)
    while getattr(placed, "more", False) and time.monotonic() < deadline:
        placed = place_waiting_jobs(window=settings.QUEUE_WINDOW * WIDER_WINDOW)
        attempts += placed
    return attempts
