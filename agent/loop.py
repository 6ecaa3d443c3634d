"""The loop a node agent runs in: one background thread that sleeps on the agent's ``wakeup``
until something is due (a beat, a reconcile, live runs' output) or a message arrives, and, in the
embedded console, the control plane's rounds (sweeps, placement) in the same thread, handing
what they place straight to the agent."""
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
    """One round of the control plane (sweeps, placement), then a full one of the local agent."""
    agent.launch_attempts(control_round())
    if agent.tick():
        place_and_launch(agent)


def place_and_launch(agent: NodeAgent) -> None:
    """Runs just ended: their GPUs are free and failovers judged, so place and start now rather
    than a round later."""
    agent.launch_attempts(place_waiting_jobs())


class EmbeddedControlLoop(threading.Thread):
    """Serves one agent until stopped. In the embedded console (``control=True``) a control round
    runs every ``AGENT_POLL_INTERVAL`` seconds, its placements are launched at once and the agent
    reconciles after it (other processes cannot wake it there); a
    scale-out node agent (``control=False``) only steps its agent. Between those the thread sleeps
    until the agent has something due: ``OUTPUT_POLL_INTERVAL`` while runs are live (files only),
    else its next heartbeat or reconcile, or a wake (a launch or a stop message)."""

    def __init__(self, agent: NodeAgent, *, interval: float | None = None, control: bool = True) -> None:
        super().__init__(name="embedded-control-loop" if control else f"agent-{agent.name}", daemon=True)
        self.agent = agent
        self.control = control
        self.interval = settings.AGENT_POLL_INTERVAL if interval is None else interval
        self.stopped = threading.Event()

    def run(self) -> None:
        logger.info("agent loop started for nodes %s", ", ".join(self.agent.node_names))
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
                if self.control and time.monotonic() >= next_round:
                    started = time.monotonic()
                    self.agent.launch_attempts(control_round())
                    # Only a round that completed waits the whole interval: one the database
                    # refused (SQLite: "database table is locked") is tried again after the pause
                    # below, not an interval later with every Pending job left waiting.
                    next_round = started + self.interval
                    # Without a broker, a stop or a fault made by another process (manage.py
                    # inject_fault, reclaim_spot) cannot wake us: re-read with every control round.
                    self.agent.wake()
                if self.agent.step() and self.control:
                    place_and_launch(self.agent)
            except Exception:
                # One bad round must not end supervision of every other job.
                logger.exception("agent round failed; retrying")
                time.sleep(min(1.0, self.interval))
            finally:
                close_old_connections()
            wait = self.agent.delay()
            if self.control:
                wait = min(wait, max(0.0, next_round - time.monotonic()))
            if wait > 0:
                self.agent.wakeup.wait(wait)

    def stop(self) -> None:
        self.stopped.set()
        self.agent.wakeup.set()
