"""What differs between engines in how their runs are started, watched and ended, as the agent's
loop asks it (issue 44): the agent composes a ``RunPort`` and its launcher a ``LaunchPort``
instead of an engine overriding the agent's methods. ``LocalRuns`` is the console's own agents'
(runs are this machine's processes: nothing to add; their launcher has no ``LaunchPort``: it
starts and signals them itself); ``agent.slurm.SlurmRuns`` and ``agent.slurm.SlurmLaunch`` are
Slurm's.

A ``RunPort``'s methods, called by ``agent.node_agent.NodeAgent``:

The agent is passed as a ``LoopView`` (its name, nodes and live ranks).

* ``start(agent)``: the agent's loop starts: what the port re-adopts (Slurm: the ranks an earlier
  console queued);
* ``before_step(agent)``: what a loop step does first (Slurm: read its records when due);
* ``beating(node_names)``: which of the agent's nodes it beats for (Slurm: those it has up);
* ``evidence_source()``: where the health monitor reads the nodes' kernel evidence;
* ``runner_alive(part, directory)``: whether a rank's runner is still on, where the port knows
  (``None``: the agent's own check of its process);
* ``judge_end(part, fact)``: how a rank ended as the agent reports it (``None``: not yet, asked
  again at a later collect);
* ``forget(part_id)``: the rank's end was reported (or it is no longer the agent's): drop what
  the port keeps of it;
* ``delay_hint()``: seconds until the port has something due (``None``: nothing), so the agent's
  idle loop wakes for it.

A ``LaunchPort``'s, called by ``agent.launch.Launcher``: ``submit`` hands a whole attempt's ranks
(each with its run directory and spec) to the cluster's scheduler, which starts their runners
later (reported when seen: ``RunPort.before_step``), ``signal`` sends a signal to a rank's run
(False where it could not), and ``account`` names the unprivileged account the scheduler runs
them as (``None``: the agent's own user).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from jobs.backends.facts import Ended, EvidenceSource, LocalKernel

if TYPE_CHECKING:
    from jobs.models import AttemptNode, JobAttempt, TrainingJob


class LoopView(Protocol):
    """What a port sees of the agent whose loop calls it (``agent.node_agent.NodeAgent``): its
    name, its nodes, and its live ranks (a port that starts one adds it)."""

    @property
    def name(self) -> str: ...

    @property
    def node_names(self) -> Sequence[str]: ...

    @property
    def live(self) -> dict[int, AttemptNode]: ...


class RunPort(Protocol):
    def start(self, agent: LoopView) -> None: ...

    def before_step(self, agent: LoopView) -> None: ...

    def beating(self, node_names: Sequence[str]) -> Sequence[str]: ...

    def evidence_source(self) -> EvidenceSource: ...

    def runner_alive(self, part: AttemptNode, directory: Path) -> bool | None: ...

    def judge_end(self, part: AttemptNode, fact: Ended) -> Ended | None: ...

    def forget(self, part_id: int) -> None: ...

    def delay_hint(self) -> float | None: ...


# A rank handed to a scheduler: its part, its run directory and its spec's path.
PreparedRank = tuple["AttemptNode", Path, Path]


@dataclass(frozen=True)
class RunAccount:
    """The unprivileged Unix account a scheduler runs every rank as (a Slurm site's service
    account, ``SLURM_USER``): the runs' directories are its, their containers rootless
    (``agent.rootless``), their images in ``storage`` on each node."""

    name: str
    uid: int
    gid: int
    storage: str


class LaunchPort(Protocol):
    def account(self) -> RunAccount | None: ...

    def submit(self, job: TrainingJob, attempt: JobAttempt, ranks: Sequence[PreparedRank], *, workdir: str, resume_step: int | None) -> None: ...

    def signal(self, part: AttemptNode, sig: int) -> bool: ...


class LocalRuns:
    """The agents' own runs: what the agent keeps of them is all there is."""

    def start(self, agent: LoopView) -> None:
        pass

    def before_step(self, agent: LoopView) -> None:
        pass

    def beating(self, node_names: Sequence[str]) -> Sequence[str]:
        return node_names

    def evidence_source(self) -> EvidenceSource:
        """The nodes are this machine: its kernel log and NVML."""
        return LocalKernel()

    def runner_alive(self, part: AttemptNode, directory: Path) -> bool | None:
        return None

    def judge_end(self, part: AttemptNode, fact: Ended) -> Ended | None:
        return fact

    def forget(self, part_id: int) -> None:
        pass

    def delay_hint(self) -> float | None:
        return None
