"""Extension points that other apps fill in from their ``AppConfig.ready()``.

``jobs`` imports none of the apps built on it; they plug in here instead (failover judges
failed runs, checks health on each agent round, sweeps lost nodes on each control round).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Called when a Running job's run fails and the job has Job Failover on:
# handler(job, attempt, outcome: str, lost: bool) -> the job's new status.
failed_run_handler: Callable[..., str] | None = None

# Called on every node-agent round with the agent.
agent_round_hooks: list[Callable[[Any], None]] = []

# Called on every control-plane round (placement and sweeps).
control_round_hooks: list[Callable[[], None]] = []
