"""Extension points of the control plane, which the apps built on ``jobs`` fill in from their
``AppConfig.ready()``.

``jobs`` imports none of the apps above it; they register here through typed interfaces instead:
failover judges failed runs (``FailedRunHandler``) and sweeps lost nodes on every control round,
logs purges old lines on it (``ControlRoundHook``; a hook may return when it next has timed work,
so an idle round sleeps until then), notify hears of every status change (``StatusChangeHook``,
called after commit with the event row's facts).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from jobs.services import wakeups

if TYPE_CHECKING:
    from jobs.models import JobAttempt, TrainingJob


class FailedRunHandler(Protocol):
    def __call__(self, job: TrainingJob, attempt: JobAttempt, outcome: str, lost: bool) -> str:
        """Judge a Running job's failed run (Job Failover on); return the job's new status."""


class FaultNamer(Protocol):
    def __call__(self, attempt: JobAttempt) -> str | None:
        """The hardware fault on the attempt's GPUs or nodes, in words, where their own evidence
        shows one (a run ended with Job Failover off says it instead of its signal)."""


class ControlRoundHook(Protocol):
    def __call__(self) -> float | None:
        """One control round's share of work (sweeps, judgements left undone, purges). Returns
        the unix time of its next timed work (a heartbeat going stale, a wait running out) when
        no event would announce it, else None: the embedded loop runs the next round by then."""


@dataclass(frozen=True)
class StatusChange:
    """One committed ``JobEvent`` written by the lifecycle (a new status, or a new reason)."""

    event_id: int
    job_id: int
    from_status: str
    to_status: str
    reason: str
    attempt: int | None


class StatusChangeHook(Protocol):
    def __call__(self, change: StatusChange) -> None:
        """Hear of a committed status change. Runs in the writer's thread: return quickly (queue
        the work), never raise."""


class AgentWaker(Protocol):
    def __call__(self, node_names: list[str]) -> None:
        """Wake this process's node agents serving any of ``node_names`` (they re-read their runs
        now: a stop to deliver, a launch to find). Return quickly, never raise."""


@dataclass
class Extensions:
    failed_run_handler: FailedRunHandler | None = None
    fault_namer: FaultNamer | None = None
    control_round_hooks: list[ControlRoundHook] = field(default_factory=list)
    status_change_hooks: list[StatusChangeHook] = field(default_factory=list)
    agent_wakers: list[AgentWaker] = field(default_factory=list)


extensions = Extensions()


def handle_failed_runs_with(handler: FailedRunHandler) -> None:
    """Set the one judge of failed runs (a second registration replaces the first)."""
    extensions.failed_run_handler = handler


def name_faults_with(namer: FaultNamer) -> None:
    """Set the one namer of a failed run's hardware fault (a second registration replaces it)."""
    extensions.fault_namer = namer


def on_control_round(hook: ControlRoundHook) -> None:
    """Run ``hook`` on every control round, before placement; registering twice runs it once."""
    if hook not in extensions.control_round_hooks:
        extensions.control_round_hooks.append(hook)


def on_status_change(hook: StatusChangeHook) -> None:
    """Call ``hook`` after each committed status change; registering twice calls it once."""
    if hook not in extensions.status_change_hooks:
        extensions.status_change_hooks.append(hook)


def status_changed(change: StatusChange) -> None:
    """Tell every registered hook (the lifecycle calls this after commit); a hook's error is logged."""
    for hook in extensions.status_change_hooks:
        try:
            hook(change)
        except Exception:
            logging.getLogger(__name__).exception("status change hook %r failed for event %s", hook, change.event_id)


def wake_agents_with(waker: AgentWaker) -> None:
    """Call ``waker`` when runs on some nodes must be looked at now (the agent app registers the
    in-process agents' wake); registering twice calls it once."""
    if waker not in extensions.agent_wakers:
        extensions.agent_wakers.append(waker)


def agents_woken(node_names: list[str]) -> None:
    for waker in extensions.agent_wakers:
        try:
            waker(node_names)
        except Exception:
            logging.getLogger(__name__).exception("agent waker %r failed", waker)
    if not wakeups.has_control_loop():
        # The nodes' agent may live in the console's process (the embedded default, no broker):
        # its loop watches the wake file, and reconciles when another process wrote it.
        wakeups.signal_other_processes()
