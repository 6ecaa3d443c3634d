"""The node agents this process runs: which nodes it serves (their GPUs can be probed and their
processes signalled from here), which agent a node's messages go to, and waking them."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from typing import Protocol


class LocalAgent(Protocol):
    node_names: Sequence[str]

    def request_launch(self, attempt_id: int) -> None: ...

    def wake(self) -> None: ...


_agents: weakref.WeakSet = weakref.WeakSet()


def add(agent: LocalAgent) -> None:
    _agents.add(agent)


def discard(agent: LocalAgent) -> None:
    _agents.discard(agent)


def local_agents() -> list[LocalAgent]:
    return list(_agents)


def agent_serving(node_name: str) -> LocalAgent | None:
    return next((a for a in list(_agents) if node_name in a.node_names), None)


def serves_node(node_name: str) -> bool:
    """Whether an agent of this process serves the node (so its GPUs are local to us)."""
    return agent_serving(node_name) is not None


def wake(node_names: Iterable[str]) -> None:
    """Wake the agents of this process serving any of ``node_names`` (``jobs.extensions`` calls this
    after a stop is committed: ``jobs.services.messages.wake_agents``)."""
    wanted = set(node_names)
    for agent in list(_agents):
        if wanted.intersection(agent.node_names):
            agent.wake()
