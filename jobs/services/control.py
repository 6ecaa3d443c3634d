"""The control round: the registered sweeps (lost nodes, failover judgements left undone, log
purges), then placement. Celery beat (scale-out), ``manage.py controlplane`` or the embedded
loop runs it."""
from __future__ import annotations

from jobs.hooks import registry
from jobs.services.placement import place_waiting_jobs


def control_round() -> list:
    """One round; returns the attempts placed."""
    for hook in registry.control_round_hooks:
        hook()
    return place_waiting_jobs()
