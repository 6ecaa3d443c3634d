"""What the node agent lets other apps plug in: work done on every agent round (failover's
health checks), and at the agent loop's start and end (failover's health monitor thread). A
plug-in is made once per agent, from the agent's public view of itself."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from jobs.backends.facts import EvidenceSource
    from jobs.models import AttemptNode


class AgentView(Protocol):
    """What a plug-in may know of the agent that made it."""

    name: str
    node_names: Sequence[str]

    def live_parts(self) -> list[AttemptNode]:
        """The agent's started runs not seen to end (``AttemptNode`` with attempt, job and node),
        from memory: a plug-in reads them without a query."""

    def signal(self, part: AttemptNode, sig: int) -> bool:
        """Send ``sig`` to the rank's run as the agent does (on Slurm: through the scheduler, to
        the run's node); False where nothing received it."""

    def wake(self) -> None:
        """Re-read the runs and the nodes now (a fault just applied, a stop to deliver)."""

    def evidence_source(self) -> EvidenceSource:
        """Where the health evidence of the agent's nodes comes from: this machine's kernel log
        and NVML, or the files each node's own health check writes."""


class AgentPlugin(Protocol):
    def on_round(self) -> None:
        """One agent round's share of work; an exception is logged and the round goes on."""

    # Optional (a plug-in without them is fine):
    # def on_start(self) -> None: the agent's loop started (start background threads here).
    # def on_shutdown(self) -> None: the agent is stopping (stop threads, release what it holds).
    # def on_reconcile(self, nodes: list[Node]) -> None: called inside the agent's read-only
    #     reconcile transaction with its nodes' fresh rows; read here, never write.
    # def next_round_in(self) -> float: seconds until ``on_round`` has work (an idle agent sleeps
    #     until the soonest of these, its heartbeat and its reconcile).
    # def before_failed_exit(self, part: AttemptNode) -> None: a rank ended badly and its end is
    #     about to be reported: facts about its node are stored first (failover's health reading),
    #     so whoever judges the attempt finds them.


PluginFactory = Callable[[AgentView], AgentPlugin]

_factories: list[PluginFactory] = []


def register(factory: PluginFactory) -> None:
    """Give every agent made from now on a plug-in made by ``factory`` (registering twice: once)."""
    if factory not in _factories:
        _factories.append(factory)


def plugins_for(agent: AgentView) -> list[AgentPlugin]:
    return [factory(agent) for factory in _factories]


def call_optional(plugins: list[AgentPlugin], hook: str, *args: object) -> None:
    """Call ``hook`` (``on_start``, ``on_shutdown``, ``on_reconcile``, ``before_failed_exit``) on every plug-in that has
    it; one failing is logged and the others still run."""

    for plugin in plugins:
        method = getattr(plugin, hook, None)
        if method is None:
            continue
        try:
            method(*args)
        except Exception:
            logging.getLogger(__name__).exception("plug-in %s: %s failed", type(plugin).__name__, hook)
