"""The node agents this process runs: which nodes it serves (their GPUs can be probed and their
processes signalled from here) and which agent a node's launch task goes to."""
from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Protocol

from jobs.models import JobAttempt


class LocalAgent(Protocol):
    node_names: Sequence[str]

    def launch(self, attempt: JobAttempt) -> None: ...


_agents: weakref.WeakSet = weakref.WeakSet()


def add(agent: LocalAgent) -> None:
    _agents.add(agent)


def agent_serving(node_name: str) -> LocalAgent | None:
    return next((a for a in list(_agents) if node_name in a.node_names), None)


def serves_node(node_name: str) -> bool:
    """Whether an agent of this process serves the node (so its GPUs are local to us)."""
    return agent_serving(node_name) is not None
