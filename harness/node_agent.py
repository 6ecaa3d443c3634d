"""Simulated nodes, a node agent on them that runs real processes, and ``drive``: placement and
the agent run until a job reaches a status."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from agent.inventory import register_nodes, simulated_nodes
from agent.loop import embedded_round
from agent.node_agent import NodeAgent


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


@pytest.fixture
def drive(agent) -> Callable:
    """Run placement and the agent until the job reaches one of ``statuses`` (or time runs out)."""

    def run(job, statuses: set[str] | str, *, timeout: float = 60.0):
        wanted = {statuses} if isinstance(statuses, str) else set(statuses)
        deadline = time.monotonic() + timeout
        while True:
            embedded_round(agent)
            job.refresh_from_db()
            if job.status in wanted:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job.name} is {job.status} ({job.status_reason}), wanted {wanted}")
            time.sleep(0.1)

    return run
