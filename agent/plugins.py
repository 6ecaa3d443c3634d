"""What the node agent lets other apps plug in: work done on every agent round (failover's
health checks). A plug-in is made once per agent, from the agent's public view of itself."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol


class AgentView(Protocol):
    """What a plug-in may know of the agent that made it."""

    name: str
    node_names: Sequence[str]


class AgentPlugin(Protocol):
    def on_round(self) -> None:
        """One agent round's share of work; an exception is logged and the round goes on."""


PluginFactory = Callable[[AgentView], AgentPlugin]

_factories: list[PluginFactory] = []


def register(factory: PluginFactory) -> None:
    """Give every agent made from now on a plug-in made by ``factory`` (registering twice: once)."""
    if factory not in _factories:
        _factories.append(factory)


def plugins_for(agent: AgentView) -> list[AgentPlugin]:
    return [factory(agent) for factory in _factories]
