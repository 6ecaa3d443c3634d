"""Celery tasks of the scale-out deployment (thin: they take ids, re-read state, call a service).

* ``place_jobs`` (queue ``control``): one control round — lost-node sweeps, failover
  judgements left undone, placement. Beat runs it every second; job creation and run exits
  trigger it at once.
* ``launch_attempt`` (queue ``node.<name>``): the node agent starts its parts of a placed
  attempt. It returns as soon as the detached supervisor is started, so a run that lasts days
  is never a long task: the message is acknowledged on receipt (not late) and cannot be
  redelivered by the broker's visibility timeout, and the part is claimed by compare-and-swap,
  so a duplicate delivery starts nothing.
"""
from __future__ import annotations

import logging

from celery import shared_task

logger = logging.getLogger(__name__)


@shared_task(name="jobs.place_jobs", ignore_result=True, acks_late=False)
def place_jobs() -> None:
    from jobs.agent.loop import control_round
    from jobs.agent.runtime import placement_started

    placement_started()
    control_round(None)


@shared_task(name="jobs.launch_attempt", ignore_result=True, acks_late=False)
def launch_attempt(attempt_id: int) -> None:
    from jobs.agent import runtime
    from jobs.models import JobAttempt

    agent = runtime.current_agent
    if agent is None:
        logger.warning("launch_attempt %s reached a worker that is not a node agent", attempt_id)
        return
    attempt = JobAttempt.objects.select_related("job").filter(pk=attempt_id, state=JobAttempt.State.PLACED).first()
    if attempt is not None:
        agent.launch(attempt)
