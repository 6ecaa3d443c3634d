"""What the control plane asks of the place attempts run, whatever it is.

Today's node agents (embedded and Celery scale-out) place attempts themselves; a cluster's
scheduler (Slurm) places them in its own queue. Both answer the same questions, so the control
plane keeps its statuses, failover verdicts, exclusions, limits and logs the same on each:

* ``submit(spec)``: start (or queue) one attempt; returns the backend's handle for it;
* ``stop(handle, grace_s)``: SIGTERM, then SIGKILL after the grace period;
* ``observe(handles)``: what became of each attempt: waiting (and why, in the backend's own
  words), running (on which nodes), exited (code or signal), or lost with its node;
* ``requeue_excluding(handle, nodes)``: the failover verb, the same attempt placed again never on
  ``nodes`` (a scheduler that keeps one job across restarts counts them in ``restarts``);
* ``drain(node, reason)`` / ``resume(node)``: take a node out of placement with the fault that
  condemned it, or return it (an operator's Mark healthy);
* ``nodes()``: every node with its GPUs and whether it takes work.

``docs/slurm.md`` maps each onto Slurm (built) and Kubernetes (written down only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

Phase = Literal["waiting", "running", "exited", "lost"]


@dataclass(frozen=True)
class AttemptSpec:
    """One attempt of a training job, as the control plane asks for it."""

    key: str  # the console's name for it ("job-12-attempt-2"): the backend's job name
    command: str  # the run's command line, run by ``bash -c`` in ``workdir``
    workdir: str
    output: str  # the file the run's output is appended to (kept across a requeue)
    environment: Mapping[str, str] = field(default_factory=dict)  # all the run gets, besides the backend's own names
    gpus_per_node: int = 0
    nodes: int = 1
    exclude: Sequence[str] = ()  # nodes this job must never run on (its failovers so far)
    max_run_minutes: int | None = None
    grace_s: int = 30
    cpus: int | None = None
    memory_mb: int | None = None
    project: str | None = None  # a Slurm account
    spot: bool = False  # preemptible capacity
    nodelist: Sequence[str] = ()  # run exactly there (the console placed it); empty: the backend places it
    requeue: bool = True  # the backend may run it again after a preemption or a node failure


@dataclass(frozen=True)
class AttemptObservation:
    handle: str
    phase: Phase
    nodes: tuple[str, ...] = ()
    reason: str = ""  # why it waits, in the backend's words (Slurm: Priority, Resources, ReqNodeNotAvail, …)
    exit_code: int | None = None
    exit_signal: int | None = None
    restarts: int = 0
    state: str = ""  # the backend's own state name (RUNNING, NODE_FAIL, PREEMPTED, …)


def state_takes_work(state: str) -> bool:
    """Whether a backend's node state lets the node take new work ("": the console's own agents,
    which have none): not drained, down, failed or not responding (Slurm's trailing ``*``)."""
    return not state or not any(word in state for word in ("DRAIN", "DOWN", "FAIL", "NOT_RESPONDING", "*"))


@dataclass(frozen=True)
class NodeView:
    name: str
    gpus: int
    takes_work: bool
    state: str  # the backend's own words (IDLE, MIXED+DRAIN, DOWN*, …)
    reason: str = ""


class Backend(Protocol):
    def submit(self, spec: AttemptSpec) -> str: ...

    def stop(self, handle: str, *, grace_s: int = 30) -> None: ...

    def observe(self, handles: Sequence[str]) -> dict[str, AttemptObservation]: ...

    def requeue_excluding(self, handle: str, nodes: Sequence[str]) -> None: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def nodes(self) -> list[NodeView]: ...
