"""Sending work to other processes after commit (scale-out only): a launch to each node agent's
queue, a control round to the control queue. Tasks are sent by name, so the control plane never
imports the agent that runs them."""

from __future__ import annotations

import logging

import redis
from celery import current_app
from django.conf import settings
from django.db import transaction

from jobs.extensions import agents_woken
from jobs.models import AttemptNode

logger = logging.getLogger(__name__)

LAUNCH_TASK = "agent.launch_attempt"
PLACE_TASK = "jobs.place_jobs"
PLACEMENT_REQUESTED = "console:placement-requested"


def node_queue(node_name: str) -> str:
    return f"node.{node_name}"


def send_task(name: str, *, args: list | None = None, queue: str) -> None:

    current_app.send_task(name, args=args or [], queue=queue)


def dispatch_launch(attempt, node_names: list[str]) -> None:
    """After commit, ask each node's agent to start its part (scale-out only; the embedded agent
    finds placed attempts on its own round)."""
    dispatch_launches([(attempt.pk, node_names)])


def dispatch_launches(launches: list[tuple[int, list[str]]]) -> None:
    """``dispatch_launch`` for a placement round's attempts (attempt id, its nodes' names): one
    after-commit callback for them all. Placement registers it before the round's live publishes,
    so the launches leave first."""
    if not settings.SCALE_OUT or not launches:
        return
    sends = [(attempt_id, name) for attempt_id, names in launches for name in sorted(set(names))]

    def send() -> None:
        for attempt_id, name in sends:
            send_task(LAUNCH_TASK, args=[attempt_id], queue=node_queue(name))

    transaction.on_commit(send)


def request_placement() -> None:
    """After commit, run a control round now rather than at the next beat (scale-out only).

    Requests made while one is already queued merge into it: a Redis key marks "a round is
    queued", and the round clears it when it starts, so a request made during a round still gets
    the next one.
    """
    if not settings.SCALE_OUT:
        return

    def send() -> None:
        try:
            if not redis_client().set(PLACEMENT_REQUESTED, 1, nx=True, ex=10):
                return
        except Exception:
            logger.warning("could not mark a placement request; sending it anyway", exc_info=True)
        send_task(PLACE_TASK, queue="control")

    transaction.on_commit(send)


def placement_started() -> None:
    if settings.SCALE_OUT:
        try:
            redis_client().delete(PLACEMENT_REQUESTED)
        except Exception:
            logger.warning("could not clear the placement request mark", exc_info=True)


_redis = None


def redis_client():
    global _redis
    if _redis is None:
        _redis = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)
    return _redis


RECONCILE_TASK = "agent.reconcile"


def wake_agents(node_names=(), *, jobs=(), attempts=()) -> None:
    """After commit, wake the agents of ``node_names`` (and of the nodes where the given jobs' or
    attempts' runs live) so they re-read their runs now: a stop reaches the run in about a second
    without agents polling. In-process agents (the embedded default, a node agent's own calls) are
    woken through ``jobs.extensions``; in scale-out each node's agent also gets ``agent.reconcile`` on
    its queue."""

    names = set(node_names)
    if jobs or attempts:
        parts = AttemptNode.objects.filter(ended_at__isnull=True)
        parts = parts.filter(attempt__job_id__in=list(jobs)) if jobs else parts.filter(attempt_id__in=list(attempts))
        names.update(parts.values_list("node__name", flat=True))
    names.discard("")
    if not names:
        return
    ordered = sorted(names)

    def send() -> None:
        agents_woken(ordered)
        if settings.SCALE_OUT:
            for name in ordered:
                try:
                    send_task(RECONCILE_TASK, args=[name], queue=node_queue(name))
                except Exception:
                    # The agent's periodic reconcile still finds the stop.
                    logger.warning("could not wake the agent of %s", name, exc_info=True)

    transaction.on_commit(send)
