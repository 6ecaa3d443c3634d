"""What an engine tells the control plane, as typed values rather than attributes to look for or
texts to parse (issue 44): where the health evidence of an agent's nodes comes from, and how an
attempt's run ended (``Ended``, its kind decides the job's outcome in ``jobs.backends.outcomes``;
``describe`` gives the words the console shows)."""

from __future__ import annotations

import json
import signal as signals
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path


@dataclass(frozen=True)
class LocalKernel:
    """The nodes' evidence is this machine's own: its kernel log and NVML (the agents, one on
    each GPU machine)."""


@dataclass(frozen=True)
class NodeCheckFiles:
    """Each node's own health check hands its evidence over as files in ``directory``
    (``failover.nodecheck``, run by Slurm as its ``HealthCheckProgram``): the nodes are not this
    machine."""

    directory: Path

    def paths(self, node: str) -> dict[str, Path]:
        """The node's files: its kernel lines, its check's cursor and its status."""
        return {
            "lines": self.directory / f"{node}.jsonl",
            "cursor": self.directory / f"{node}.cursor",
            "status": self.directory / f"{node}.status.json",
        }

    def gpus_seen(self, node: str) -> bool | None:
        """Whether the node's own NVML sees GPUs (its status's ``gpus_by_pci``); None until its
        check has written a status."""
        try:
            found = json.loads(self.paths(node)["status"].read_bytes()[:1_000_000]).get("gpus_by_pci")
        except (OSError, ValueError, AttributeError):
            return None
        return bool(found) if isinstance(found, dict) else None


EvidenceSource = LocalKernel | NodeCheckFiles


# --- how a run ended ----------------------------------------------------------------------------
# The first words of two causes (``describe``); the texts users read, never a key to decide by.
OUT_OF_MEMORY = "out of memory"
PIDS_LIMIT = "PID limit reached"


class EndKind(StrEnum):
    """How an attempt's run ended, as its engine (or the console's own watch) saw it. The job's
    outcome follows from the kind and the job's situation alone (``jobs.backends.outcomes``)."""

    EXITED = "exited"  # the run's own exit code (0: it finished)
    SIGNALED = "signaled"  # killed by a signal no one here named (a stop's, a kill's, anyone's)
    OUT_OF_MEMORY = "oom"  # the kernel killed it at the job's own memory limit
    PID_LIMIT = "pids"  # it sat at its process limit and the runner ended it
    STORAGE_LIMIT = "storage"  # the agent's storage watch ended it (the job's or its project's limit)
    TIME_LIMIT = "time_limit"  # the scheduler's time limit (Slurm's TIMEOUT)
    PREEMPTED = "preempted"  # the scheduler preempted it for other work (Slurm's PREEMPTED)
    NODE_LOST = "node_lost"  # its node was lost (no heartbeat, the scheduler's DOWN or NODE_FAIL)
    SUPERVISOR_LOST = "supervisor_lost"  # its runner died without an exit record
    EXIT_UNREADABLE = "unreadable"  # its runner's exit record says neither a code nor a signal
    HUNG_AFTER_KILL = "hung_after_kill"  # killed for a fatal GPU event, it did not exit after SIGKILL
    CANCELLED = "cancelled"  # ended by someone outside the console (an operator's scancel)
    LAUNCH_FAILED = "launch_failed"  # the platform could not start it (its directories, its process)
    ABANDONED = "abandoned"  # given up before it started (its job stopped, its image missing)


# The ends that say no more than the exit itself: every other kind is a cause.
PLAIN = frozenset({EndKind.EXITED, EndKind.SIGNALED})


@dataclass(frozen=True)
class Ended:
    """An attempt's run (or one rank of it) ended. ``detail`` is the kind's own words: the storage
    limit's verdict, the fatal event a hung run was killed for, the lost node's reason, the
    scheduler's reason, the launch error, or (preempted) the cause the run's runner gave; ``limit``
    the memory limit in MiB (out of memory) or the process limit (PID limit). ``handle`` and
    ``state`` are the scheduler's job and its final state where its record says how the run ended;
    ``node`` the lost node. ``evidence`` is what the engine saw, for the judge (the table reads
    only the kind)."""

    kind: EndKind
    exit_code: int | None = None
    exit_signal: int | None = None
    detail: str = ""
    limit: int | None = None
    node: str = ""
    handle: str = ""
    state: str = ""
    evidence: Mapping[str, object] = field(default_factory=dict)

    @property
    def plain(self) -> bool:
        """The end says no more than its exit code or signal (no cause)."""
        return self.kind in PLAIN


def exited(exit_code: int | None, exit_signal: int | None) -> Ended:
    """A run that ended with ``exit_code`` or by ``exit_signal``, and nothing more to say."""
    return Ended(EndKind.SIGNALED if exit_signal else EndKind.EXITED, exit_code=exit_code, exit_signal=exit_signal)


def format_memory(mb: int) -> str:
    if mb >= 1024:
        return f"{mb / 1024:.4g} GiB"
    return f"{mb} MiB"


def describe_exit(exit_code: int | None, exit_signal: int | None) -> str:
    if exit_signal:
        try:
            name = signals.Signals(exit_signal).name
        except ValueError:
            name = f"signal {exit_signal}"
        return f"killed by {name}"
    return f"exit code {exit_code}"


def describe(fact: Ended) -> str:
    """The end in the words the console shows (an attempt's cause, a job's reason)."""
    kind = fact.kind
    if kind in PLAIN:
        return describe_exit(fact.exit_code, fact.exit_signal)
    if kind is EndKind.OUT_OF_MEMORY:
        limit = f"its memory limit of {format_memory(fact.limit)}" if fact.limit else "its memory limit"
        return f"{OUT_OF_MEMORY}: the run needed more than {limit} and the kernel killed it"
    if kind is EndKind.PID_LIMIT:
        limit = f"its limit of {fact.limit} processes" if fact.limit else "its process limit"
        return f"{PIDS_LIMIT}: the run kept {limit} (a fork loop?) and the platform ended it"
    if kind is EndKind.SUPERVISOR_LOST:
        if fact.handle:  # the scheduler's record says how the batch job ended
            return f"{describe_exit(fact.exit_code, fact.exit_signal)}: Slurm job {fact.handle} {fact.state}, its runner left no exit record"
        return "the run's supervisor process was lost"
    if kind is EndKind.EXIT_UNREADABLE:
        return "the run's exit record was unreadable"
    if kind is EndKind.HUNG_AFTER_KILL:
        return f"fatal GPU event ({fact.detail}); the run did not exit after SIGKILL"
    if kind is EndKind.PREEMPTED:
        who = f"Slurm (job {fact.handle})" if fact.handle else "the scheduler"
        return f"preempted by {who} for higher-priority work" + (f"; {fact.detail}" if fact.detail else "")
    if kind in (EndKind.CANCELLED, EndKind.TIME_LIMIT, EndKind.NODE_LOST) and fact.handle:  # in the scheduler's words
        return f"Slurm ended job {fact.handle}: {fact.state}" + (f" ({fact.detail})" if fact.detail else "")
    if kind is EndKind.NODE_LOST:
        return f"node {fact.node} lost ({fact.detail})"
    if kind is EndKind.LAUNCH_FAILED:
        return f"launch failed: {fact.detail}"
    return fact.detail  # the storage watch's verdict, why an attempt was given up: the producer's words
