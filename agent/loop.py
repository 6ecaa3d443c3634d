"""The loop a node agent runs in: one background thread that sleeps on the agent's ``wakeup``
until something is due (a beat, a reconcile, live runs' output) or a message arrives, and, in the
embedded console, the control plane's rounds (sweeps, placement) in the same thread, when
something changed their answer (``jobs.services.wakeups``), handing what they place straight to
the agent."""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections

from jobs.backends.base import Backend
from jobs.services import wakeups
from jobs.services.control import control_round

logger = logging.getLogger(__name__)

# A timed round runs this long after its moment (seconds), so the round finds the work due.
TIMED_MARGIN = 0.05


def embedded_round(agent: Backend) -> None:
    """One round of the control plane (sweeps, placement), then a full one of the local agent."""
    agent.launch_attempts(control_round())
    if agent.tick():
        place_and_launch(agent)


def place_and_launch(agent: Backend) -> None:
    """Runs just ended: a control round now rather than a round later, so failed runs are judged
    (``failover.services.policy.judge_exited``: the control plane's verdict, not the agent's)
    and their freed GPUs placed and started at once."""
    agent.launch_attempts(control_round())


class EmbeddedControlLoop(threading.Thread):
    """Serves one agent until stopped.

    In the embedded console (``control=True``) a control round runs when something changed its
    answer and at nothing else but its own timed work and a safety sweep:

    * a wake-up from this process (``jobs.services.wakeups.round_wanted``: a job created, stopped,
      deleted or resumed, a status change — an attempt ended, a verdict, a back-off —, a node
      cleared or reclaimed), at once;
    * a wake-up from another process (``manage.py inject_fault``, ``reclaim_spot``, ``job stop``):
      the wake file, checked every ``CONTROL_WAKE_FILE_CHECK`` seconds; the agent reconciles too,
      since a stop or a fault made there is in no message;
    * the round's next timed work (``Round.next_due``: a retry time, a heartbeat going stale, a
      hold running out);
    * every ``interval`` seconds (``CONTROL_SWEEP_INTERVAL``): the safety sweep.

    Its placements are launched at once. A round the database refused is tried again after a
    pause of a second. A scale-out node agent (``control=False``) only steps its agent (and,
    without a broker, watches the wake file). Between those the thread sleeps until the agent has
    something due: ``OUTPUT_POLL_INTERVAL`` while runs are live (files only), else its next
    heartbeat or reconcile, or a wake (a launch or a stop message).

    ``CONTROL_WAKEUPS=0`` brings back the fixed schedule this replaced, for comparison: a round
    every ``AGENT_POLL_INTERVAL`` and an agent reconcile after each."""

    def __init__(self, agent: Backend, *, interval: float | None = None, control: bool = True) -> None:
        super().__init__(name="embedded-control-loop" if control else f"agent-{agent.name}", daemon=True)
        self.agent = agent
        self.control = control
        self.polling = not settings.CONTROL_WAKEUPS
        default = settings.AGENT_POLL_INTERVAL if self.polling else settings.CONTROL_SWEEP_INTERVAL
        self.interval = default if interval is None else interval
        self.stopped = threading.Event()

    def run(self) -> None:
        logger.info("agent loop started for nodes %s", ", ".join(self.agent.node_names))
        self.agent.start()
        wanted = wakeups.subscribe(self.agent.wakeup.set) if self.control and not self.polling else None
        watch = None if settings.SCALE_OUT or self.polling else wakeups.FileWatch()
        try:
            self.serve(wanted, watch)
        finally:
            if wanted is not None:
                wakeups.unsubscribe(wanted)
            self.agent.shutdown()
            close_old_connections()

    def serve(self, wanted: wakeups.Subscription | None = None, watch: wakeups.FileWatch | None = None) -> None:
        schedule = Schedule(self.agent, control=self.control, interval=self.interval, polling=self.polling, wanted=wanted, watch=watch)
        while not self.stopped.is_set():
            wait = 0.0
            try:
                wait = schedule.turn()
            except Exception:
                # One bad round must not end supervision of every other job.
                logger.exception("agent round failed; retrying")
                time.sleep(min(1.0, self.interval))
            finally:
                close_old_connections()
            if wait > 0:
                self.agent.wakeup.wait(wait)

    def stop(self) -> None:
        self.stopped.set()
        self.agent.wakeup.set()


class Schedule:
    """What an agent's loop runs, and when (``EmbeddedControlLoop``; the suite drives its agents
    with it too, ``harness.node_agent.pump_until``): a control round when woken (``wanted``), when its
    timed work is due or every ``interval`` seconds; an agent step when a round ran, when the agent
    is woken or when ``agent.delay()`` says something is due."""

    def __init__(
        self,
        agent: Backend,
        *,
        control: bool,
        interval: float,
        polling: bool = False,
        wanted: wakeups.Subscription | None = None,
        watch: wakeups.FileWatch | None = None,
    ) -> None:
        self.agent = agent
        self.control = control
        self.interval = interval
        self.polling = polling
        self.wanted = wanted
        self.watch = watch
        self.next_round = 0.0  # monotonic; the first round at once
        self.agent_due = 0.0

    def turn(self) -> float:
        """Runs what is due; returns the seconds until something else is (0: go on at once).
        A round that raised stays due: the caller pauses and turns again."""
        agent, wanted, watch = self.agent, self.wanted, self.watch
        if watch is not None and watch.changed():
            agent.wake()
            if wanted is not None:
                wanted.raise_flag()
        now = time.monotonic()
        woken = wanted.take() if wanted is not None else False
        ran = False
        if self.control and (woken or now >= self.next_round):
            # Due until it completes: a round that raised (the database unreachable, or held by
            # another writer past its busy timeout) is tried again after the caller's pause, not a
            # sweep later.
            self.next_round = now
            placed = control_round()
            agent.launch_attempts(placed)
            self.next_round = now + self.interval
            due = getattr(placed, "next_due", None)
            if due is not None and not self.polling:
                self.next_round = min(self.next_round, time.monotonic() + max(0.0, due - time.time()) + TIMED_MARGIN)
            if self.polling:
                agent.wake()  # the old schedule: re-read the runs after every round
            ran = True
        if ran or agent.wakeup.is_set() or time.monotonic() >= self.agent_due:
            if agent.step() and self.control:
                place_and_launch(agent)
            self.agent_due = time.monotonic() + agent.delay()
        wait = max(0.0, self.agent_due - time.monotonic())
        if self.control:
            wait = 0.0 if wanted is not None and wanted.pending() else min(wait, max(0.0, self.next_round - time.monotonic()))
        if watch is not None:
            wait = min(wait, watch.due_in())
        return wait
