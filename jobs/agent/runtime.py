"""The node agent this process runs, if any, and dispatching work to agents' queues."""
from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

logger = logging.getLogger(__name__)

current_agent = None  # the NodeAgent of a `manage.py nodeagent` process
# Nodes whose GPUs this process can probe itself (its agents' nodes).
local_nodes: set[str] = set()


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"


def dispatch_launch(attempt) -> None:
    """After commit, ask each node's agent to start its part (scale-out only; the embedded agent
    finds placed attempts on its own round)."""
    if not settings.SCALE_OUT:
        return
    names = sorted(set(attempt.placements.values_list("node__name", flat=True)))

    def send() -> None:
        from jobs.tasks import launch_attempt

        for name in names:
            launch_attempt.apply_async(args=[attempt.pk], queue=node_queue(name))

    transaction.on_commit(send)


def request_placement() -> None:
    """After commit, run a control round now rather than at the next beat (scale-out only)."""
    if not settings.SCALE_OUT:
        return

    def send() -> None:
        from jobs.tasks import place_jobs

        place_jobs.apply_async(queue="control")

    transaction.on_commit(send)
