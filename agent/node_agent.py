"""The node agent: it launches placed runs on its nodes, runs its plug-ins (health checks),
delivers stops, and collects every live run's output and exit.

It waits instead of polling. Its live runs are kept in memory — from its own launches and from
one read-only reconcile (at start, after a wake, and every ``AGENT_RECONCILE_INTERVAL``).
Collecting output and exits reads only the runs' files (``agent.runfiles``); the database is
touched when there is news (new lines, an exit, a launch) and for the heartbeat. Stops arrive as
wakes (``jobs.services.messages.wake_agents``); the grace period's SIGKILL and a job's max run time
are timed from memory. An idle agent sleeps on ``wakeup`` until its next beat.

A launch arrives one way: an attempt id in the agent's inbox (``request_launch``), launched by
``step`` in the agent's own thread. What puts ids there: a launch message (``agent.launch_attempt``,
scale-out), the embedded control round in the same thread (``launch_attempts``), and the reconcile,
which finds placed ranks of its nodes not started yet (the recovery after a restart or a lost
message). Each rank is claimed by compare-and-swap, so an id delivered twice starts nothing twice.

Each run is supervised by ``agent.runner`` in its own session, so the agent (and the console it
may live in) can restart at any time: its first reconcile finds every run of its nodes again from
the files the runner keeps, ingests the output lines it has not stored yet (delivery is
idempotent) and reports the exits it missed. What those facts mean for a job is decided by the
control plane (``jobs.services.runs``).
"""

from __future__ import annotations

import logging
import math
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from agent import local_agents, runfiles
from agent.launch import Launcher
from agent.output import OutputReader
from agent.plugins import call_optional, plugins_for
from agent.ports import LocalRuns, RunPort
from agent.processes import run_dir
from jobs import heartbeats
from jobs.backends.base import Backend
from jobs.backends.facts import Ended, EndKind, EvidenceSource, exited
from jobs.heartbeats import beat_interval
from jobs.models import AttemptNode, JobAttempt, Node
from jobs.services import runs, wakeups
from jobs.services.control import postgres_transaction
from jobs.statuses import WAITING, JobStatus

logger = logging.getLogger(__name__)

# A launched runner that has not written its pid record by then is taken as lost.
LAUNCH_TIMEOUT = timedelta(seconds=60)
KILL_REPEAT = 1.0  # seconds between SIGKILLs to a run that has not exited yet


def db_beat_interval() -> float:
    """How often a scale-out agent also writes ``Node.last_heartbeat``. Not tied to the (short)
    lease: the sweep gives a node with no beat in Redis that long on top (``heartbeats.db_deadline``)."""
    return settings.NODE_HEARTBEAT_DB_INTERVAL


def beat_now(node_names: list[str]) -> None:
    """A first beat, before anything slow (registration, stray runs): all agents restarting at
    once never make a healthy node look lost. Scale-out only (embedded nodes are never swept)."""
    if settings.SCALE_OUT:
        try:
            heartbeats.beat(node_names, time.time())
        except Exception as exc:
            logger.warning("first heartbeat of %s failed: %s", ", ".join(node_names), exc)


class NodeAgent(Backend):
    """The console's own engine (``jobs.backends.base.Backend``): serves a set of nodes.
    ``step()`` does what is due and says when to call it again; ``tick()`` is a full round (a
    reconcile first), for tools and tests."""

    def __init__(self, node_names: list[str], *, name: str = "embedded", launcher: Launcher | None = None, port: RunPort | None = None) -> None:
        self.node_names: Sequence[str] = list(node_names)
        self.name = name
        self.launcher = launcher or Launcher(self.node_names)
        self.port: RunPort = port or LocalRuns()  # what the engine adds to how runs are watched (agent.ports)
        self.output = OutputReader()
        self.live: dict[int, AttemptNode] = {}  # started, not seen to end: AttemptNode id → part
        self.terminated: set[int] = set()  # AttemptNode ids sent SIGTERM by this agent
        self.killed: dict[int, float] = {}  # AttemptNode id → when last sent SIGKILL (monotonic)
        self.over_time: set[int] = set()  # jobs reported past their max run time
        self.wakeup = threading.Event()
        self.notify: Callable[[], None] | None = None  # a scheduler serving many agents (bench.scale.fleet)
        self.lock = threading.Lock()
        self.inbox: dict[int, None] = {}  # attempt ids to launch on the next step, in arrival order (once each)
        self.reconcile_due = True
        self.next_reconcile = 0.0
        self.next_beat = 0.0
        self.next_db_beat = 0.0
        self.last_heartbeat: datetime | None = None
        self.plugins = plugins_for(self)
        local_agents.add(self)

    def start(self) -> None:
        """The agent's loop starts: plug-ins start their own threads (failover's health monitor),
        and the port re-adopts what it watches (Slurm: ranks an earlier console queued)."""
        call_optional(self.plugins, "on_start")
        self.port.start(self)

    def shutdown(self) -> None:
        """The agent stops: plug-ins stop their threads and release what they hold (NVML)."""
        call_optional(self.plugins, "on_shutdown")

    # --- messages (any thread) -----------------------------------------------------------------
    def wake(self) -> None:
        """Re-read the runs now (a stop to deliver, a fault, a launch a message missed)."""
        with self.lock:
            self.reconcile_due = True
        self._notify()

    def signal(self, part: AttemptNode, sig: int) -> bool:
        """Send ``sig`` to the rank's run through the launcher (failover's kills, storage limits)."""
        return self.launcher.signal(part, sig)

    def evidence_source(self) -> EvidenceSource:
        """Where the nodes' kernel evidence comes from, as the port says (the agents': this
        machine's kernel log and NVML)."""
        return self.port.evidence_source()

    def request_launch(self, attempt_id: int) -> None:
        """The one way a launch arrives: the attempt is launched by the agent's own loop at once
        (its ranks on this agent's nodes; the others are left to their agents)."""
        with self.lock:
            self.inbox[attempt_id] = None
        self._notify()

    def _notify(self) -> None:
        self.wakeup.set()
        if self.notify is not None:
            self.notify()

    def stop_strays(self, node_names: Sequence[str] | None = None) -> None:
        """At start: end processes of parts the control plane closed while this agent was away
        (its node was taken as lost), so a job never runs twice; and deliver the output they
        wrote meanwhile, so no line is lost. ``node_names``: of those nodes only (default: all)."""
        recent = timezone.now() - timedelta(days=7)
        # Closed without an exit seen by an agent: the sweeper ended them when the node was lost.
        parts = AttemptNode.objects.filter(
            node__name__in=self.node_names if node_names is None else node_names,
            ended_at__gte=recent,
            runner_pid__gt=0,
            exit_code__isnull=True,
            exit_signal__isnull=True,
        ).select_related("attempt")
        for part in parts:
            directory = run_dir(part)
            if not runfiles.exit_written(directory) and self.launcher.signal(part, signal.SIGKILL):
                logger.warning("job %s: killed stray run of attempt %s", part.attempt.job_id, part.attempt.number)
            while not self.drain(part, directory, complete=True):
                pass
            self.output.forget(part.pk)
            self.live.pop(part.pk, None)
        self.sweep_strays()

    def sweep_strays(self) -> None:
        """Remove what no live run holds: containers and job networks left by runs killed
        outright (every agent of this console on this host shares the container engine: any of
        its live runs counts, not only this agent's)."""
        live = set()
        for part in AttemptNode.objects.filter(ended_at__isnull=True).select_related("attempt"):
            policy = runfiles.spec_container(run_dir(part)) or {}
            if policy.get("name"):
                live.add(str(policy["name"]))
        self.launcher.sweep_strays(live)

    # --- rounds --------------------------------------------------------------------------------
    def tick(self) -> int:
        """One full round, a reconcile first; returns how many runs were seen to end."""
        self.reconcile_due = True
        return self.step()

    def step(self) -> int:
        """Do what is due: beat, reconcile when asked or due, launch what the inbox holds,
        plug-ins, stops, output and exits. Returns how many runs were seen to end."""
        self.port.before_step(self)
        self.wakeup.clear()
        self.heartbeat()
        with self.lock:
            reconcile = self.reconcile_due or time.monotonic() >= self.next_reconcile
        if reconcile:
            self.reconcile()
        self.launch_inbox()
        for plugin in self.plugins:
            try:
                plugin.on_round()
            except Exception:
                logger.exception("agent %s: plug-in %s failed this round", self.name, type(plugin).__name__)
        self.enforce_stops()
        ended = self.collect()
        self.launcher.reap()
        return ended

    def delay(self) -> float:
        """Seconds until ``step()`` has something to do (a message wakes the agent earlier)."""
        now = time.monotonic()
        due = [self.next_beat, self.next_reconcile]
        if self.live:
            due.append(now + settings.OUTPUT_POLL_INTERVAL)
        for plugin in self.plugins:
            hint = getattr(plugin, "next_round_in", None)
            if hint is not None:
                due.append(now + hint())
        if (port_due := self.port.delay_hint()) is not None:
            due.append(now + port_due)
        with self.lock:
            if self.reconcile_due or self.inbox:
                return 0.0
        if self.output.behind:
            return 0.0  # a run printed more than its turn (agent.output): the next turn now
        return max(0.0, min(due) - now)

    def heartbeat(self) -> None:
        """Beat when due, for the nodes the port says (Slurm: those it has up). Scale-out: one
        Redis write, the database every ``db_beat_interval()``; embedded: one UPDATE for all
        served nodes."""
        now_m = time.monotonic()
        if now_m < self.next_beat:
            return
        names = self.port.beating(self.node_names)
        self.next_beat = now_m + beat_interval() * random.uniform(0.85, 1.0)  # jitter: never later than the interval
        now = timezone.now()
        lost_here = False
        to_db = not settings.SCALE_OUT or now_m >= self.next_db_beat
        if settings.SCALE_OUT:
            try:
                lost_here = bool(heartbeats.beat(names, now.timestamp()))
            except Exception as exc:
                logger.warning("agent %s: heartbeat to Redis failed (%s); writing it to the database", self.name, exc)
                to_db = True
        revived = 0
        if to_db:
            self.next_db_beat = now_m + db_beat_interval() * random.uniform(0.8, 1.0)
            with postgres_transaction():
                Node.objects.filter(name__in=names).update(last_heartbeat=now)
                revived = Node.objects.filter(name__in=names, state=Node.State.NOT_READY).update(state=Node.State.READY)
        elif lost_here:
            revived = Node.objects.filter(name__in=names, state=Node.State.NOT_READY).update(state=Node.State.READY, last_heartbeat=now)
        self.last_heartbeat = now
        # Beating again after the control plane took a node as lost: it is Ready again, and the
        # runs it closed meanwhile must not go on here.
        if revived:
            Node.objects.filter(name__in=names, health_reason__startswith="lost:").update(health_reason="")
            logger.warning("agent %s: heartbeat resumed; nodes Ready again", self.name)
            self.stop_strays(names)
            wakeups.round_wanted()  # the nodes can take waiting jobs again

    def reconcile(self) -> None:
        """One read-only transaction: this agent's started runs and the placed ranks not started
        yet (their attempts go to the inbox), with its nodes for the plug-ins."""
        with self.lock:
            self.reconcile_due = False
        # Jittered, so a fleet started (or restarted) at once does not reconcile in one burst.
        self.next_reconcile = time.monotonic() + settings.AGENT_RECONCILE_INTERVAL * random.uniform(0.8, 1.2)
        with postgres_transaction():  # read-only
            parts = list(
                AttemptNode.objects.filter(node__name__in=self.node_names, ended_at__isnull=True)
                .filter(Q(runner_pid__gt=0) | Q(runner_pid__isnull=True, attempt__state=JobAttempt.State.PLACED))
                .select_related("attempt", "attempt__job", "node")
            )
            nodes = list(Node.objects.filter(name__in=self.node_names))
            call_optional(self.plugins, "on_reconcile", nodes)
        live = {p.pk: p for p in parts if p.runner_pid}
        for gone in set(self.live) - set(live):
            self.forget(gone)
        self.live = live
        placed = sorted({p.attempt for p in parts if p.runner_pid is None}, key=lambda a: a.created_at)
        with self.lock:
            for attempt in placed:
                self.inbox[attempt.pk] = None

    def live_parts(self) -> list[AttemptNode]:
        """The parts of runs on our nodes that were started and have not been seen to end."""
        return list(self.live.values())

    # --- launch ----------------------------------------------------------------------------
    def launch_inbox(self) -> None:
        """Launch the attempts in the inbox that are still placed, oldest first."""
        with self.lock:
            ids, self.inbox = list(self.inbox), {}
        if not ids:
            return
        for attempt in JobAttempt.objects.filter(pk__in=ids, state=JobAttempt.State.PLACED).select_related("job").order_by("created_at"):
            self.launch(attempt)

    def launch(self, attempt: JobAttempt) -> None:
        parts = self.launcher.launch(attempt)
        if not parts:
            return
        # The attempt and its job as they are now, read once: a stop that raced the launch is
        # seen by this step's stop round (and the job Running, by the max-run-time check).
        fresh = JobAttempt.objects.select_related("job").get(pk=attempt.pk)
        for part in parts:
            part.attempt = fresh
            self.live[part.pk] = part

    # --- stop ------------------------------------------------------------------------------
    def enforce_stops(self) -> None:
        """Report runs past their max run time; signal the runs whose job is stopping or whose
        attempt must end (SIGTERM, then SIGKILL after the grace period), all from memory."""
        now = timezone.now()
        grace = timedelta(seconds=settings.STOP_GRACE_PERIOD)
        for part in list(self.live.values()):
            attempt = part.attempt
            job = attempt.job
            if job.status == JobStatus.RUNNING and attempt.stop_requested_at is None:
                if job.max_run_minutes and job.started_at and job.pk not in self.over_time and now - job.started_at > timedelta(minutes=job.max_run_minutes):
                    self.over_time.add(job.pk)
                    runs.max_run_time_reached(job)
                    self.wake()
                continue
            if attempt.state == JobAttempt.State.PLACED and attempt.stop_requested_at is None and job.status in WAITING:
                continue  # still being launched (here or, for other ranks, by other agents): not Running yet
            stopped_at = runs.stop_begun(attempt)
            if part.pk not in self.terminated and self.launcher.signal(part, signal.SIGTERM):
                self.terminated.add(part.pk)
            if now - stopped_at >= grace and time.monotonic() - self.killed.get(part.pk, -math.inf) >= KILL_REPEAT:
                self.killed[part.pk] = time.monotonic()
                self.launcher.signal(part, signal.SIGKILL)

    # --- output and exits ------------------------------------------------------------------
    def collect(self) -> int:
        """Ingest new output of every live run and report the runs that ended; returns how many.

        The runs that kept up last round go first; each run still behind (a flood) then has its
        turn, and after each such turn the others' new lines are stored: a quiet run's line waits
        for one flood's turn at most, not for every flood's."""
        ended = 0
        parts = list(self.live.values())
        quiet = [part for part in parts if part.pk not in self.output.behind]
        for part in [*quiet, *(part for part in parts if part.pk in self.output.behind)]:
            flood = part.pk in self.output.behind
            ended += self.collect_safely(part)
            if flood:
                for other in quiet:
                    if other.pk in self.live and other.pk not in self.output.behind:
                        self.catch_up(other)
            self.heartbeat()
        return ended

    def collect_safely(self, part: AttemptNode) -> int:
        try:
            return self.collect_part(part)
        except Exception:
            # One run's bad output or exit record must not stop the others being served.
            logger.exception("job %s: collecting attempt %s rank %s failed", part.attempt.job_id, part.attempt.number, part.rank)
            return 0

    def catch_up(self, part: AttemptNode) -> None:
        """Between two floods' turns: store what a quiet run printed meanwhile (its exit waits for
        the next round)."""
        directory = run_dir(part)
        try:
            if self.output.printed_since(part, directory):
                self.drain(part, directory)
        except Exception:
            logger.exception("job %s: reading attempt %s rank %s's output failed", part.attempt.job_id, part.attempt.number, part.rank)

    def collect_part(self, part: AttemptNode) -> int:
        directory = run_dir(part)
        record = runfiles.read_exit(directory)  # read first: once it exists, the output is whole
        drained = self.drain(part, directory, complete=record is not None)
        if record is not None:
            if not drained:
                return 0
            self.part_ended(part, recorded_end(record))
            return 1
        if not self.runner_alive(part, directory):
            self.part_ended(part, Ended(EndKind.SUPERVISOR_LOST))
            return 1
        return 0

    def drain(self, part: AttemptNode, directory: Path, *, complete: bool = False) -> bool:
        """Ingest the run's next output lines; True once everything written so far is stored."""
        return self.output.drain(part, directory, complete=complete)

    def runner_alive(self, part: AttemptNode, directory: Path) -> bool:
        """Whether the rank's runner is still on: the port's word where it has one (Slurm's
        records), else its process on this machine."""
        if (known := self.port.runner_alive(part, directory)) is not None:
            return known
        pid = part.runner_pid
        if pid is None:
            return False
        if self.launcher.alive(pid):
            return True
        # The runner may have finished between our reads: trust its exit record if it is there now.
        if runfiles.exit_written(directory):
            return True
        started = part.attempt.started_at or part.attempt.created_at
        return not runfiles.pid_written(directory) and timezone.now() - started < LAUNCH_TIMEOUT and pid in self.launcher.children

    def part_ended(self, part: AttemptNode, fact: Ended) -> None:
        """Report the rank's end as the port judges it (``None``: not yet; reported at a later
        collect, e.g. once Slurm has recorded how its batch job ended)."""
        judged = self.port.judge_end(part, fact)
        if judged is None:
            return
        fact = judged
        # Forgotten only once reported: a report the database refused (a lock, a restart) is made
        # again at the next collect. (Forgotten first, the rank's end was never reported again:
        # its row was marked ended, so no reconcile would bring it back, and the job stayed Running.)
        if fact.exit_signal or fact.exit_code not in (0,) or not fact.plain:
            # The agent reports facts only: its node's evidence is stored before the exit that
            # the control plane's failover verdict will read it for.
            call_optional(self.plugins, "before_failed_exit", part)
        others = runs.part_exited(part, fact)
        self.forget(part.pk)
        # Only this agent's own ranks: another node's agent ends its ranks itself, woken by the
        # attempt's stop request (a pid read from a shared JOB_WORK_ROOT names another machine's
        # process).
        for other in others:
            if other.node.name in self.node_names:
                self.launcher.signal(other, signal.SIGTERM)

    def forget(self, part_id: int) -> None:
        self.live.pop(part_id, None)
        self.output.forget(part_id)
        self.terminated.discard(part_id)
        self.killed.pop(part_id, None)
        self.port.forget(part_id)


def recorded_end(record: runfiles.ExitRecord) -> Ended:
    """How a run ended, from its runner's exit record: killed at its memory limit (a signal or an
    error exit with the kernel's OOM kills counted), ended at its PID limit, its exit, or a record
    that says neither a code nor a signal."""
    code, sig = record.exit_code, record.signal
    if (sig or code) and record.out_of_memory:
        return Ended(EndKind.OUT_OF_MEMORY, exit_code=code, exit_signal=sig, limit=record.memory_limit_mb)
    if record.pids_limit_hit is not None:
        return Ended(EndKind.PID_LIMIT, exit_code=code, exit_signal=sig, limit=record.pids_limit_hit)
    return exited(code, sig) if record.readable else Ended(EndKind.EXIT_UNREADABLE, exit_code=code, exit_signal=sig)
