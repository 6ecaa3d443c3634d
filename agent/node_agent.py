"""The node agent: one round launches placed runs on its nodes, runs its plug-ins (health
checks), delivers stops, and collects every live run's output and exit.

Each run is supervised by ``agent.runner`` in its own session, so the agent (and the console it
may live in) can restart at any time: on its next round it finds every run of its nodes again
from the files the runner keeps, ingests the output lines it has not stored yet (delivery is
idempotent) and reports the exits it missed. What those facts mean for a job is decided by the
control plane (``jobs.services.runs``).
"""
from __future__ import annotations

import logging
import signal
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.utils import timezone

from agent import registry
from agent.launch import Launcher
from agent.output import OutputReader
from agent.plugins import call_optional, plugins_for
from agent.processes import is_runner, read_json, run_dir, signal_run
from jobs.models import AttemptNode, JobAttempt, Node, TrainingJob
from jobs.services import runs
from jobs.statuses import WAITING, JobStatus

logger = logging.getLogger(__name__)

# A launched runner that has not written pid.json by then is taken as lost.
LAUNCH_TIMEOUT = timedelta(seconds=60)


class NodeAgent:
    """Serves a set of nodes. ``tick()`` does one round of work; call it periodically."""

    def __init__(self, node_names: list[str], *, name: str = "embedded") -> None:
        self.node_names = list(node_names)
        self.name = name
        self.launcher = Launcher(self.node_names)
        self.output = OutputReader()
        self.terminated: set[int] = set()  # AttemptNode ids sent SIGTERM by this agent
        self.last_heartbeat = None
        self.plugins = plugins_for(self)
        registry.add(self)

    def start(self) -> None:
        """The agent's loop starts: plug-ins start their own threads (failover's health monitor)."""
        call_optional(self.plugins, "on_start")

    def shutdown(self) -> None:
        """The agent stops: plug-ins stop their threads and release what they hold (NVML)."""
        call_optional(self.plugins, "on_shutdown")

    def stop_strays(self) -> None:
        """At start: end processes of parts the control plane closed while this agent was away
        (its node was taken as lost), so a job never runs twice; and deliver the output they
        wrote meanwhile, so no line is lost."""
        recent = timezone.now() - timedelta(days=7)
        # Closed without an exit seen by an agent: the sweeper ended them when the node was lost.
        parts = AttemptNode.objects.filter(
            node__name__in=self.node_names, ended_at__gte=recent, runner_pid__gt=0, exit_code__isnull=True, exit_signal__isnull=True
        ).select_related("attempt")
        for part in parts:
            directory = run_dir(part)
            if not (directory / "exit.json").exists() and signal_run(part, signal.SIGKILL):
                logger.warning("job %s: killed stray run of attempt %s", part.attempt.job_id, part.attempt.number)
            while not self.drain(part, directory):
                pass
            self.output.forget(part.pk)

    # --- one round -------------------------------------------------------------------------
    def tick(self) -> int:
        """One full round; returns how many runs were seen to end."""
        self.heartbeat()
        self.launch_placed()
        for plugin in self.plugins:
            try:
                plugin.on_round()
            except Exception:
                logger.exception("agent %s: plug-in %s failed this round", self.name, type(plugin).__name__)
        self.enforce_stops()
        ended = self.collect()
        self.launcher.reap()
        return ended

    def heartbeat(self) -> None:
        now = timezone.now()
        # Three beats per timeout, at most every 5 s: one late beat never makes a node lost.
        every = timedelta(seconds=min(5.0, settings.NODE_HEARTBEAT_TIMEOUT / 3))
        if self.last_heartbeat and now - self.last_heartbeat < every:
            return
        Node.objects.filter(name__in=self.node_names).update(last_heartbeat=now)
        self.last_heartbeat = now
        # Beating again after the control plane took a node as lost: it is Ready again, and the
        # runs it closed meanwhile must not go on here.
        if Node.objects.filter(name__in=self.node_names, state=Node.State.NOT_READY).update(state=Node.State.READY):
            Node.objects.filter(name__in=self.node_names, health_reason__startswith="lost:").update(health_reason="")
            logger.warning("agent %s: heartbeat resumed; nodes Ready again", self.name)
            self.stop_strays()

    # --- launch ----------------------------------------------------------------------------
    def launch_placed(self) -> None:
        attempts = (
            JobAttempt.objects.filter(
                state=JobAttempt.State.PLACED, placements__node__name__in=self.node_names, placements__runner_pid__isnull=True
            )
            .select_related("job")
            .distinct()
            .order_by("created_at")
        )
        for attempt in attempts:
            self.launch(attempt)

    def launch(self, attempt: JobAttempt) -> None:
        self.launcher.launch(attempt)

    # --- stop ------------------------------------------------------------------------------
    def enforce_stops(self) -> None:
        """Report runs past their max run time; signal the runs whose job is stopping or whose
        attempt must end (SIGTERM, then SIGKILL after the grace period)."""
        now = timezone.now()
        grace = timedelta(seconds=settings.STOP_GRACE_PERIOD)
        for job in TrainingJob.objects.filter(
            status=JobStatus.RUNNING, max_run_minutes__isnull=False, attempts__placements__node__name__in=self.node_names
        ).distinct():
            if job.started_at and now - job.started_at > timedelta(minutes=job.max_run_minutes):
                runs.max_run_time_reached(job)
        for part in self.live_parts().select_related("attempt", "attempt__job"):
            attempt = part.attempt
            if attempt.job.status == JobStatus.RUNNING and attempt.stop_requested_at is None:
                continue
            if attempt.state == JobAttempt.State.PLACED and attempt.stop_requested_at is None and attempt.job.status in WAITING:
                continue  # still being launched (here or, for other ranks, by other agents): not Running yet
            if attempt.stop_requested_at is None:
                JobAttempt.objects.filter(pk=attempt.pk, stop_requested_at__isnull=True).update(stop_requested_at=now)
                attempt.stop_requested_at = now
            if part.pk not in self.terminated and signal_run(part, signal.SIGTERM):
                self.terminated.add(part.pk)
            if now - attempt.stop_requested_at >= grace:
                signal_run(part, signal.SIGKILL)

    def live_parts(self):
        """The parts of runs on our nodes that were started and have not been seen to end."""
        return AttemptNode.objects.filter(node__name__in=self.node_names, runner_pid__gt=0, ended_at__isnull=True)

    # --- output and exits ------------------------------------------------------------------
    def collect(self) -> int:
        """Ingest new output of every live run and report the runs that ended; returns how many."""
        ended = 0
        for part in self.live_parts().select_related("attempt", "node"):
            try:
                ended += self.collect_part(part)
            except Exception:
                # One run's bad output or exit record must not stop the others being served.
                logger.exception("job %s: collecting attempt %s rank %s failed", part.attempt.job_id, part.attempt.number, part.rank)
            self.heartbeat()
        return ended

    def collect_part(self, part: AttemptNode) -> int:
        directory = run_dir(part)
        exit_info = read_json(directory / "exit.json")  # read first: once it exists, output is whole
        drained = self.drain(part, directory)
        if exit_info is not None:
            if not drained:
                return 0
            code, sig = exit_info.get("exit_code"), exit_info.get("signal")
            code = int_in(code, -(2**31), 2**31)
            sig = int_in(sig, 1, 128)
            cause = "" if code is not None or sig else "the run's exit record was unreadable"
            if (sig or code) and out_of_memory(exit_info):
                cause = runs.memory_limit_cause(whole_number(exit_info.get("memory_limit_mb")))
            self.part_ended(part, code, sig, cause)
            return 1
        if not self.runner_alive(part, directory):
            self.part_ended(part, None, None, "the run's supervisor process was lost")
            return 1
        return 0

    def drain(self, part: AttemptNode, directory: Path) -> bool:
        """Ingest the run's next output lines; True once everything written so far is stored."""
        return self.output.drain(part, directory)

    def runner_alive(self, part: AttemptNode, directory: Path) -> bool:
        pid = part.runner_pid
        if pid is None:
            return False
        if is_runner(pid):
            return True
        # The runner may have finished between our reads: trust exit.json if it is there now.
        if (directory / "exit.json").exists():
            return True
        started = part.attempt.started_at or part.attempt.created_at
        return not (directory / "pid.json").exists() and timezone.now() - started < LAUNCH_TIMEOUT and pid in self.launcher.children

    def part_ended(self, part: AttemptNode, exit_code: int | None, exit_signal: int | None, cause: str) -> None:
        self.output.forget(part.pk)
        self.terminated.discard(part.pk)
        for other in runs.part_exited(part, exit_code=exit_code, exit_signal=exit_signal, cause=cause):
            signal_run(other, signal.SIGTERM)


def int_in(value: object, low: int, high: int) -> int | None:
    """An integer from a run's record when ``low <= value < high``, else None: what a job could
    have written there is never trusted (a bool, a float, a huge number)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and low <= value < high else None


def whole_number(value: object) -> int | None:
    """A positive count from a record, or None."""
    return int_in(value, 1, 2**53)


def out_of_memory(exit_info: dict) -> bool:
    """The kernel killed a process of the run for exceeding the run's memory limit."""
    return whole_number(exit_info.get("oom_kills")) is not None
