"""A cluster scheduler's verbs (``Scheduler``) and Slurm's (``SlurmScheduler``): what the Slurm
engine asks of the cluster, never what the control plane asks of an engine (that is
``jobs.backends.base.Backend``).

* ``submit(spec)``: start (or queue) one attempt; returns the scheduler's handle for it;
* ``stop(handle, grace_s)``: SIGTERM, then SIGKILL after the grace period;
* ``observe(handles)``: what became of each attempt: waiting (and why, in the scheduler's own
  words), running (on which nodes), exited (code or signal), or lost with its node;
* ``requeue_excluding(handle, nodes)``: the failover verb, the same attempt placed again never on
  ``nodes`` (a scheduler that keeps one job across restarts counts them in ``restarts``);
* ``drain(node, reason)`` / ``resume(node)``: take a node out of placement with the fault that
  condemned it, or return it (an operator's Mark healthy);
* ``nodes()``: every node with its GPUs and whether it takes work (``state_takes_work``, the rule
  placement reads ``Node.backend_state`` by).

``docs/slurm.md`` maps each onto Slurm (built) and Kubernetes (written down only).

On Slurm each attempt is one batch job:

* ``submit``: ``sbatch`` with the GPUs as GRES (``--gres=gpu:N``), ``--nodes``, the job's
  exclusions as ``--exclude``, CPUs and memory, the max run time as ``--time`` with SIGTERM
  ``grace_s`` before it (``--signal=B:TERM@N``), the project as the Slurm account, Spot as the
  preemptible partition or QOS the operator named (``SLURM_SPOT_PARTITION`` / ``SLURM_SPOT_QOS``),
  the output appended to one file (a requeue keeps what was printed), ``--requeue``, the comment
  ``sacct`` shows, and only the run's own environment (``--export``). The batch script ``exec``s
  the command on one node; on several, ``srun --label`` starts one task per node, all at once
  (each line prefixed with its rank); a task that ends leaves the others to the console.
* ``stop``: SIGTERM to every process of the job (``scancel --signal=TERM --full``); an attempt
  still running ``grace_s`` later is cancelled at the next ``observe`` (SIGKILL after Slurm's
  ``KillWait``).
* ``observe``: ``scontrol show job``: PENDING, REQUEUED, CONFIGURING → waiting with Slurm's reason;
  RUNNING, COMPLETING → running on its nodes; NODE_FAIL → lost; any other end → exited with its
  code or signal (``ExitCode=code:signal``); a job Slurm has forgotten → exited, unknown.
* ``requeue_excluding``: ``scontrol requeue`` (SIGTERM, then PENDING with ``Restarts`` + 1), then,
  once PENDING, ``ExcNodeList`` = its exclusions and ``nodes``, ``StartTime=now``.
* ``drain`` / ``resume`` / ``nodes``: ``scontrol update nodename=… state=drain reason=…`` /
  ``state=resume`` / ``scontrol show node``.
"""

from __future__ import annotations

import dataclasses
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from jobs.backends.base import state_takes_work
from jobs.backends.slurm.client import SlurmClient, SlurmError, SlurmJob, Submission

WAITING = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "CONFIGURING", "RESIZING", "SUSPENDED", "PREEMPTED"}
RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
LOST = {"NODE_FAIL", "BOOT_FAIL"}
REQUEUE_WAIT_S = 10.0

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
    comment: str = ""  # what the cluster's records keep of who asked for it (Slurm: ``--comment``, in ``sacct``)
    user: str | None = None  # the Unix account it runs as, where the console (root) submits for it


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


@dataclass(frozen=True)
class NodeView:
    name: str
    gpus: int
    takes_work: bool
    state: str  # the backend's own words (IDLE, MIXED+DRAIN, DOWN*, …)
    reason: str = ""
    cpus: int | None = None
    memory_mb: int | None = None
    address: str = ""
    gpus_in_use: int = 0  # allocated to jobs by the backend, whoever's


class Scheduler(Protocol):
    def submit(self, spec: AttemptSpec) -> str: ...

    def stop(self, handle: str, *, grace_s: int = 30) -> None: ...

    def observe(self, handles: Sequence[str]) -> dict[str, AttemptObservation]: ...

    def requeue_excluding(self, handle: str, nodes: Sequence[str]) -> None: ...

    def drain(self, node: str, reason: str) -> None: ...

    def resume(self, node: str) -> None: ...

    def nodes(self) -> list[NodeView]: ...


class SlurmScheduler:
    """The Scheduler of one Slurm cluster, through its commands (``client``)."""

    def __init__(self, client: SlurmClient, *, spot_partition: str | None = None, spot_qos: str | None = None, partition: str | None = None) -> None:
        self.client = client
        self.partition = partition or None
        self.spot_partition = spot_partition
        self.spot_qos = spot_qos
        self.kill_after: dict[str, float] = {}  # handle → monotonic time its grace period ends

    def submit(self, spec: AttemptSpec) -> str:
        command = shlex.quote(spec.command)
        if spec.nodes > 1:
            # A rank that ends does not end the others: the console judges the attempt.
            run = f"exec srun --nodes={spec.nodes} --ntasks-per-node=1 --kill-on-bad-exit=0 --label bash -c {command}"
        else:
            run = f"exec bash -c {command}"
        script = f"#!/bin/bash\n{run}\n"
        submission = Submission(
            name=spec.key, script=script, output=spec.output, workdir=spec.workdir, gpus_per_node=spec.gpus_per_node,
            nodes=spec.nodes, exclude=tuple(spec.exclude), time_limit_minutes=spec.max_run_minutes, grace_s=spec.grace_s,
            cpus_per_task=spec.cpus, memory_mb=spec.memory_mb, account=spec.project,
            partition=self.spot_partition if spec.spot else self.partition, qos=self.spot_qos if spec.spot else None,
            environment=dict(spec.environment), nodelist=tuple(spec.nodelist), requeue=spec.requeue, comment=spec.comment, user=spec.user,
        )  # fmt: skip
        return str(self.client.submit(submission))

    def stop(self, handle: str, *, grace_s: int = 30) -> None:
        self.client.cancel(int(handle), signal="TERM")
        self.kill_after[handle] = time.monotonic() + max(0, grace_s)

    def observe(self, handles: Sequence[str]) -> dict[str, AttemptObservation]:
        seen: dict[str, AttemptObservation] = {}
        now = time.monotonic()
        known = {str(job.job_id): job for job in self.client.jobs()} if len(handles) > 1 else {}
        for handle in handles:
            job = known.get(handle) if known else self.client.job(int(handle))
            seen[handle] = observation(handle, job)
            deadline = self.kill_after.get(handle)
            if deadline is None:
                continue
            if seen[handle].phase in ("exited", "lost"):
                del self.kill_after[handle]
            elif now >= deadline:
                self.client.cancel(int(handle))  # the grace period is over
                del self.kill_after[handle]
        return seen

    def requeue_excluding(self, handle: str, nodes: Sequence[str]) -> None:
        job_id = int(handle)
        self.client.requeue(job_id)
        deadline = time.monotonic() + REQUEUE_WAIT_S
        while True:  # scontrol requeue returns before the job is PENDING
            job = self.client.job(job_id)
            if job is not None and job.state in WAITING:
                break
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} was not pending {REQUEUE_WAIT_S:.0f}s after its requeue: {job.state if job else 'gone'}")
            time.sleep(0.05)
        excluded = list(dict.fromkeys([*job.excluded, *nodes]))
        self.client.exclude_and_start(job_id, excluded)

    def drain(self, node: str, reason: str) -> None:
        self.client.drain(node, reason)

    def resume(self, node: str) -> None:
        self.client.resume(node)

    def nodes(self) -> list[NodeView]:
        return [
            NodeView(
                name=node.name,
                gpus=node.gpus,
                takes_work=state_takes_work(node.state),
                state=node.state,
                reason=node.reason,
                cpus=node.cpus,
                memory_mb=node.memory_mb,
                address=node.address,
                gpus_in_use=node.gpus_in_use,
            )
            for node in self.client.nodes()
        ]


def observation(handle: str, job: SlurmJob | None) -> AttemptObservation:
    if job is None:
        return AttemptObservation(handle=handle, phase="exited", reason="Slurm no longer knows the job", state="UNKNOWN")
    base = AttemptObservation(handle=handle, phase="waiting", nodes=tuple(job.nodes), restarts=job.restarts, state=job.state)
    if job.state in WAITING:
        return dataclasses.replace(base, reason=job.reason)
    if job.state in RUNNING:
        return dataclasses.replace(base, phase="running")
    if job.state in LOST:
        return dataclasses.replace(base, phase="lost", reason=job.reason)
    # ExitCode=code:signal; a job ended by a signal has code 0 and the signal.
    signal = job.exit_signal or None
    return dataclasses.replace(base, phase="exited", exit_code=None if signal else job.exit_code, exit_signal=signal, reason=job.reason)
