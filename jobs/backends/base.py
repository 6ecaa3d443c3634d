"""What the control plane asks of the engine that runs its jobs, whatever the engine is
(``Backend``): the console's own node agents (``agent.node_agent.NodeAgent``) today, and on a Slurm
cluster the Slurm engine (issue 44: siblings, neither subclassing the other's classes).

The methods are the ones the console calls on an engine, no more: the loop it runs in
(``agent.loop``: ``start``, ``step``, ``tick``, ``delay``, ``wakeup``, ``shutdown``), what hands it
work (``request_launch`` from a launch message, ``launch_attempts`` from the embedded control
round), what wakes it (``wake``: a stop, a fault) and what failover's and the agent's plug-ins use
(``live_parts``, ``signal``, ``evidence_source``, the subset ``agent.plugins.AgentView`` names).
The cluster verbs only a scheduler has (submit, observe, requeue, drain) are
``jobs.backends.slurm.scheduler.Scheduler``'s, which the Slurm engine speaks to.

How a run ended is reported as a typed fact (``jobs.backends.facts.Ended``) to
``jobs.services.runs``; the one table ``jobs.backends.outcomes`` decides what it means for the job.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from jobs.backends.facts import EvidenceSource
    from jobs.models import AttemptNode, JobAttempt


def state_takes_work(state: str) -> bool:
    """Whether a backend's node state lets the node take new work ("": the console's own agents,
    which have none): not drained, down, failed or not responding (Slurm's trailing ``*``)."""
    return not state or not any(word in state for word in ("DRAIN", "DOWN", "FAIL", "NOT_RESPONDING", "*"))


class Backend(abc.ABC):
    """The engine of a set of nodes, as the control plane and its plug-ins speak to it."""

    name: str  # shown in logs and thread names
    node_names: Sequence[str]  # the nodes it serves (``agent.local_agents`` routes their messages here)
    wakeup: threading.Event  # set by anything that has work for it; its loop sleeps on it

    # --- its loop (agent.loop) -------------------------------------------------------------
    @abc.abstractmethod
    def start(self) -> None:
        """The loop starts (its plug-ins start their threads; runs left queued are found again)."""

    @abc.abstractmethod
    def shutdown(self) -> None:
        """The loop stops: plug-ins stop their threads and release what they hold."""

    @abc.abstractmethod
    def step(self) -> int:
        """Do what is due (beat, launch, stops, output, exits); returns how many runs ended."""

    @abc.abstractmethod
    def tick(self) -> int:
        """One full round with everything re-read first (tools and tests); as ``step``."""

    @abc.abstractmethod
    def delay(self) -> float:
        """Seconds until ``step`` has something to do (``wakeup`` ends the wait earlier)."""

    # --- messages (any thread) ---------------------------------------------------------------
    @abc.abstractmethod
    def wake(self) -> None:
        """Re-read the runs and the nodes now (a stop to deliver, a fault just applied)."""

    @abc.abstractmethod
    def request_launch(self, attempt_id: int) -> None:
        """The one way a launch arrives: the placed attempt's ranks on these nodes are started by
        the engine's own loop (claimed by compare-and-swap: an id delivered twice starts once)."""

    def launch_attempts(self, attempts: Sequence[JobAttempt]) -> None:
        """The embedded control round placed these."""
        for attempt in attempts:
            self.request_launch(attempt.pk)

    # --- what plug-ins use (agent.plugins.AgentView) -----------------------------------------
    @abc.abstractmethod
    def live_parts(self) -> list[AttemptNode]:
        """The started ranks not seen to end, from memory (with attempt, job and node)."""

    @abc.abstractmethod
    def signal(self, part: AttemptNode, sig: int) -> bool:
        """Send ``sig`` to the rank's run, wherever it runs; False where nothing received it."""

    @abc.abstractmethod
    def evidence_source(self) -> EvidenceSource:
        """Where the health evidence of the nodes comes from (this machine, or each node's check)."""
