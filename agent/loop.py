"""The loop a node agent runs in: its rounds in one background thread, and, in the embedded
console, the control plane's rounds (sweeps, placement) in the same thread."""
from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections

from agent.inventory import discover_nodes, register_nodes
from agent.node_agent import NodeAgent
from jobs.services.control import control_round
from jobs.services.placement import place_waiting_jobs

logger = logging.getLogger(__name__)


def start_local_agent(*, name: str = "embedded") -> NodeAgent:
    """Register this machine's nodes (real or simulated) and return the agent serving them."""
    nodes = register_nodes(discover_nodes(), agent=name)
    return NodeAgent([n.name for n in nodes], name=name)


def embedded_round(agent: NodeAgent) -> None:
    """One round of the control plane (sweeps, placement), then one of the local agent."""
    control_round()
    if agent.tick():
        place_and_launch(agent)


def place_and_launch(agent: NodeAgent) -> None:
    """Runs just ended: their GPUs are free and failovers judged, so place and start now rather
    than a round later."""
    if place_waiting_jobs():
        agent.launch_placed()


class EmbeddedControlLoop(threading.Thread):
    """Runs a full round every ``AGENT_POLL_INTERVAL`` seconds until stopped — ``embedded_round``
    (sweeps, placement and the agent) in the embedded console, the agent's ``tick`` alone in a
    scale-out node agent (``control=False``) — and in between collects the runs' output and exits
    every ``OUTPUT_POLL_INTERVAL`` seconds, so a printed line reaches the log tab (and a dead
    process its failover) without waiting for a full round."""

    def __init__(self, agent: NodeAgent, *, interval: float | None = None, control: bool = True) -> None:
        super().__init__(name="embedded-control-loop" if control else f"agent-{agent.name}", daemon=True)
        self.agent = agent
        self.control = control
        self.interval = settings.AGENT_POLL_INTERVAL if interval is None else interval
        self.output_interval = min(settings.OUTPUT_POLL_INTERVAL, self.interval)
        self.stopped = threading.Event()

    def run(self) -> None:
        logger.info("embedded control loop started for nodes %s", ", ".join(self.agent.node_names))
        self.agent.start()
        try:
            self.serve()
        finally:
            self.agent.shutdown()
            close_old_connections()

    def serve(self) -> None:
        next_round = 0.0
        while not self.stopped.is_set():
            try:
                if time.monotonic() >= next_round:
                    next_round = time.monotonic() + self.interval
                    if self.control:
                        embedded_round(self.agent)
                    else:
                        self.agent.tick()
                elif self.agent.collect() and self.control:
                    place_and_launch(self.agent)
            except Exception:
                # One bad round must not end supervision of every other job.
                logger.exception("control round failed; retrying")
            finally:
                close_old_connections()
            self.stopped.wait(self.output_interval)

    def stop(self) -> None:
        self.stopped.set()
