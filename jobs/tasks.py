"""Celery tasks of the control plane (thin: they take ids, re-read state, call a service).

``place_jobs`` (queue ``control``): one control round — lost-node sweeps, failover judgements
left undone, placement (in bulk, and on at once while full windows are placed whole, up to
``QUEUE_ROUND_BUDGET``). Beat runs it every second; job creation and run exits trigger it at once.
The node agent's own task (``agent.launch_attempt``) lives in ``agent.tasks``.
"""

from __future__ import annotations

from celery import shared_task

from jobs.services import control
from jobs.services.messages import PLACE_TASK, placement_started


@shared_task(name=PLACE_TASK, ignore_result=True, acks_late=False)
def place_jobs() -> None:
    placement_started()
    control.control_round()
