"""Extension points of the control plane, which the apps built on ``jobs`` fill in from their
``AppConfig.ready()``.

``jobs`` imports none of the apps above it; they register here through typed interfaces instead:
failover judges failed runs (``FailedRunHandler``) and sweeps lost nodes on every control round,
logs purges old lines on it (``ControlRoundHook``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from jobs.models import JobAttempt, TrainingJob


class FailedRunHandler(Protocol):
    def __call__(self, job: TrainingJob, attempt: JobAttempt, outcome: str, lost: bool) -> str:
        """Judge a Running job's failed run (Job Failover on); return the job's new status."""


class ControlRoundHook(Protocol):
    def __call__(self) -> None:
        """One control round's share of work (sweeps, judgements left undone, purges)."""


@dataclass
class Registry:
    failed_run_handler: FailedRunHandler | None = None
    control_round_hooks: list[ControlRoundHook] = field(default_factory=list)


registry = Registry()


def handle_failed_runs_with(handler: FailedRunHandler) -> None:
    """Set the one judge of failed runs (a second registration replaces the first)."""
    registry.failed_run_handler = handler


def on_control_round(hook: ControlRoundHook) -> None:
    """Run ``hook`` on every control round, before placement; registering twice runs it once."""
    if hook not in registry.control_round_hooks:
        registry.control_round_hooks.append(hook)
