"""Simulated nodes, a node agent on them that runs real processes, ``pump_until``: the agent and
the control plane run as the console runs them until a condition holds, and ``drive``: until a job
reaches a status."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from django.conf import settings

from agent.inventory import register_nodes, simulated_nodes
from agent.loop import Schedule
from agent.node_agent import NodeAgent
from jobs.backends.base import Backend
from jobs.services import wakeups

T = TypeVar("T")
CHECK_EVERY = 0.1  # seconds between two looks at the test's condition


@pytest.fixture
def nodes(db, settings):
    """Three simulated nodes with four GPUs each, registered as the embedded agent does."""

    settings.SIMULATED_NODES = 3
    settings.SIMULATED_GPUS_PER_NODE = 4
    return register_nodes(simulated_nodes(), agent="embedded")


@pytest.fixture
def agent(nodes, settings):

    settings.STOP_GRACE_PERIOD = 5.0
    return NodeAgent([n.name for n in nodes])


def pump_until(
    agent: Backend,
    condition: Callable[[], T],
    what: str,
    *,
    timeout: float = 60.0,
    every: float = CHECK_EVERY,
    also: Callable[[], object] | None = None,
    describe: Callable[[], str] | None = None,
) -> T:
    """Runs ``agent`` and the control plane until ``condition()`` returns something true (returned).

    They run on the console's own schedule (``agent.loop.Schedule``), woken as its loop is (a
    status change, a placement, a message to the agent) and otherwise at the fixed schedule of
    ``CONTROL_WAKEUPS=0``: a round and a reconcile every ``AGENT_POLL_INTERVAL``, the agent's own
    steps when due. The condition is checked (after ``also()``, the test's own work) every
    ``every`` seconds; a round does not run that often (ten full rounds a second cost a test
    process most of a core). Raises AssertionError naming ``what`` (and ``describe()``) when
    ``timeout`` runs out."""
    wanted = wakeups.subscribe(agent.wakeup.set)
    try:
        watch = None if settings.SCALE_OUT else wakeups.FileWatch()
        schedule = Schedule(agent, control=True, interval=settings.AGENT_POLL_INTERVAL, polling=True, wanted=wanted, watch=watch)
        deadline = time.monotonic() + timeout
        while True:
            wait = schedule.turn()
            if also is not None:
                also()
            result = condition()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"never: {what}" + (f" ({describe()})" if describe else ""))
            agent.wakeup.wait(min(wait, every))
    finally:
        wakeups.unsubscribe(wanted)


@pytest.fixture
def drive(agent) -> Callable:
    """Run placement and the agent until the job reaches one of ``statuses`` (or time runs out)."""

    def run(job, statuses: set[str] | str, *, timeout: float = 60.0):
        wanted = {statuses} if isinstance(statuses, str) else set(statuses)

        def reached():
            job.refresh_from_db()
            return job.status in wanted

        pump_until(agent, reached, f"job {job.name} in {wanted}", timeout=timeout, describe=lambda: f"it is {job.status}: {job.status_reason}")
        return job

    return run
