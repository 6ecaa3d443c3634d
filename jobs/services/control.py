"""The control round: the registered sweeps (lost nodes, failover judgements left undone, log
purges), then placement. Celery beat (scale-out), ``manage.py controlplane`` or the embedded
loop runs it."""
from __future__ import annotations

import time

from django.conf import settings

from jobs.hooks import registry
from jobs.services.placement import place_waiting_jobs


def control_round() -> list:
    """One round; returns the attempts placed.

    A placement round looks at each project's first ``QUEUE_WINDOW`` jobs of a shape. When it
    placed such a full window whole, the jobs behind it may fit now: placement goes on at once,
    round after round, for up to ``QUEUE_ROUND_BUDGET`` seconds, rather than a window per beat
    (each round commits on its own, so its launches leave at once)."""
    for hook in registry.control_round_hooks:
        hook()
    deadline = time.monotonic() + settings.QUEUE_ROUND_BUDGET
    placed = place_waiting_jobs()
    attempts = list(placed)
    while getattr(placed, "more", False) and time.monotonic() < deadline:
        placed = place_waiting_jobs()
        attempts += placed
    return attempts
