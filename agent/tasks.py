"""The node agent's Celery task (scale-out): ``agent.launch_attempt`` on queue ``node.<name>``.

The agent starts its parts of a placed attempt and returns as soon as the detached supervisor is
started, so a run that lasts days is never a long task: the message is acknowledged on receipt
(not late) and cannot be redelivered by the broker's visibility timeout, and each part is claimed
by compare-and-swap, so a duplicate delivery starts nothing.
"""
from __future__ import annotations

import logging

from celery import shared_task

from agent import registry
from jobs.models import JobAttempt
from jobs.services.dispatch import LAUNCH_TASK

logger = logging.getLogger(__name__)


@shared_task(name=LAUNCH_TASK, ignore_result=True, acks_late=False)
def launch_attempt(attempt_id: int) -> None:
    attempt = JobAttempt.objects.select_related("job").filter(pk=attempt_id, state=JobAttempt.State.PLACED).first()
    if attempt is None:
        return
    names = attempt.placements.values_list("node__name", flat=True)
    agents = {id(a): a for a in (registry.agent_serving(n) for n in names) if a is not None}
    if not agents:
        logger.warning("launch_attempt %s reached a worker that serves none of its nodes", attempt_id)
    for agent in agents.values():
        agent.launch(attempt)
