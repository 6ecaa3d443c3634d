"""The node agent's Celery tasks (scale-out), on queue ``node.<name>``: ``agent.launch_attempt``
(a placed attempt to start) and ``agent.reconcile`` (re-read the runs now: a stop to deliver).

Both only hand the message to the agent's own loop and return (a launch into its inbox,
``NodeAgent.request_launch``, the one way a launch arrives), so the message is acknowledged on
receipt (not late) and cannot be redelivered by the broker's visibility timeout; each part is
claimed by compare-and-swap when launched, so a duplicate delivery starts nothing.
"""

from __future__ import annotations

import logging

from celery import shared_task

from agent import local_agents
from jobs.services.messages import LAUNCH_TASK, RECONCILE_TASK

logger = logging.getLogger(__name__)


@shared_task(name=LAUNCH_TASK, ignore_result=True, acks_late=False)
def launch_attempt(attempt_id: int) -> None:
    agents = local_agents.local_agents()
    if not agents:
        logger.warning("launch_attempt %s reached a worker that serves no node", attempt_id)
    for agent in agents:  # each starts only its own nodes' ranks
        agent.request_launch(attempt_id)


@shared_task(name=RECONCILE_TASK, ignore_result=True, acks_late=False)
def reconcile(node_name: str) -> None:
    local_agents.wake([node_name])
