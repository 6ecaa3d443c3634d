"""The fair-share queue's decisions, on plain data: no Django, no database.

``plan_round`` takes the waiting jobs (each project's head of line per shape), the projects'
quotas and usage and the free GPUs, and says which jobs to place where, which capacity a
starving job reserves, which Spot runs yield to an On-Demand job within quota, and why every other
job waits and where it stands in line. ``jobs.services.placement`` feeds it from the database and
carries the plan out; ``bench.queue`` replays a trace through it.

The order (docs/quotas.md): first jobs for which Spot runs were already preempted, then jobs
waiting longer than the reservation bound (oldest first), then jobs within their project's quota
before jobs that would borrow, and among those the project whose recent use per share is lowest (its decayed GPU-seconds, Slurm's half-life, plus what it holds now, divided by
its quota), within a project the higher priority, then the older job. A project's key grows as
its jobs are placed in the round, so a burst from two projects interleaves by share.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

# Places in line are told exactly up to this many per shape; behind them a job is "behind N+".
PLACES_SHOWN = 20


@dataclass(frozen=True)
class WaitingJob:
    id: int
    project: int
    gpus_per_node: int
    node_count: int
    priority: int = 0
    created: float = 0.0  # seconds (any epoch; only the order matters)
    spot: bool = False
    exclude_nodes: frozenset[int] = frozenset()
    exclude_gpus: frozenset[tuple[int, int]] = frozenset()
    starving: bool = False  # waited past the reservation bound
    yielded_to: bool = False  # Spot runs were preempted for it and are stopping or stopped

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.node_count

    @property
    def shape(self) -> tuple[int, int]:
        return (self.gpus_per_node, self.node_count)


@dataclass
class ProjectShare:
    quota: int = 0
    borrow_limit: int | None = None  # None: no limit
    cpu_job_limit: int = 8
    used_gpus: int = 0  # held now (placed and running attempts)
    used_cpu_jobs: int = 0
    usage: float = 0.0  # decayed GPU-seconds

    @property
    def ceiling(self) -> float:
        return math.inf if self.borrow_limit is None else self.quota + self.borrow_limit

    @property
    def borrowed(self) -> int:
        return max(0, self.used_gpus - self.quota)

    def key(self, half_life: float) -> float:
        """Recent use per share: lower goes first. Decayed GPU-seconds at a constant g GPUs settle
        at g·H/ln 2, so ``usage·ln2/H`` reads as "GPUs held on average lately"."""
        recent = self.usage * math.log(2) / half_life if half_life > 0 else 0.0
        return (recent + self.used_gpus) / max(self.quota, 1)


def decayed(usage: float, *, held_gpus: int, seconds: float, half_life: float) -> float:
    """Usage after ``seconds`` more: the old part halves every ``half_life``, the GPUs held add."""
    if seconds <= 0:
        return usage
    factor = 0.5 ** (seconds / half_life) if half_life > 0 else 0.0
    return usage * factor + held_gpus * seconds


@dataclass(frozen=True)
class HeldOut:
    """Free GPUs of a Ready, uncordoned node that health keeps out of placement until an operator
    marks them healthy: the GPUs a GPU-scoped fault marked, or every GPU of a node a node-wide
    fault marked (``whole_node``)."""

    node: int
    name: str
    gpus: tuple[int, ...]  # its free GPUs held out
    whole_node: bool
    cause: str  # "Xid 79"
    since: str  # "18:20" ("": not known)

    @property
    def label(self) -> str:
        if self.whole_node or not self.gpus:
            return self.name
        return f"{self.name} GPU{'s' if len(self.gpus) > 1 else ''} {', '.join(map(str, self.gpus))}"


@dataclass
class Capacity:
    """Free GPU indices per schedulable node, in node-name order; updated as jobs are placed.

    Nodes are also indexed by their number of free GPUs (a heap of name positions per count,
    stale entries skipped when met), so a one-node job finds its first fit without walking the
    fleet: a round costs the same whether the full nodes are ten or a thousand."""

    nodes: list[tuple[int, str]] = field(default_factory=list)  # (node id, name), by name
    free: dict[int, list[int]] = field(default_factory=dict)
    spot_held: frozenset[int] = frozenset()  # nodes whose spot capacity was just reclaimed
    addresses: dict[int, str] = field(default_factory=dict)  # where ranks reach each node
    held_out: tuple[HeldOut, ...] = ()  # unhealthy capacity, for the waiting jobs' reasons
    names: dict[int, str] = field(default_factory=dict)  # every node's name (excluded ones too)
    _position: dict[int, int] = field(init=False, repr=False, compare=False)
    _by_count: dict[int, list[int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._position = {node: i for i, (node, _name) in enumerate(self.nodes)}
        self._by_count = defaultdict(list)
        for i, (node, _name) in enumerate(self.nodes):
            if self.free.get(node):
                self._by_count[len(self.free[node])].append(i)
        for heap in self._by_count.values():
            heapq.heapify(heap)

    def first_fit(self, job: WaitingJob) -> list[tuple[int, list[int]]] | None:
        """``node_count`` distinct nodes with ``gpus_per_node`` free GPUs each, first by name."""
        if job.node_count == 1 and job.gpus_per_node and not (job.exclude_nodes or job.exclude_gpus) and not (job.spot and self.spot_held):
            position = self.first_with(job.gpus_per_node)
            if position is None:
                return None
            node_id = self.nodes[position][0]
            return [(node_id, self.free[node_id][: job.gpus_per_node])]
        chosen: list[tuple[int, list[int]]] = []
        for node_id, _name in self.nodes:
            if node_id in job.exclude_nodes or (job.spot and node_id in self.spot_held):
                continue
            free = [i for i in self.free.get(node_id, []) if (node_id, i) not in job.exclude_gpus]
            if len(free) >= job.gpus_per_node:
                chosen.append((node_id, free[: job.gpus_per_node]))
                if len(chosen) == job.node_count:
                    return chosen
        return None

    def first_with(self, gpus: int) -> int | None:
        """The first node (its position in name order) with at least ``gpus`` free GPUs."""
        best: int | None = None
        for count, heap in self._by_count.items():
            if count < gpus:
                continue
            while heap and len(self.free.get(self.nodes[heap[0]][0], ())) != count:
                heapq.heappop(heap)
            if heap and (best is None or heap[0] < best):
                best = heap[0]
        return best

    def take(self, chosen: Iterable[tuple[int, list[int]]]) -> None:
        for node_id, indices in chosen:
            self.set_free(node_id, [i for i in self.free.get(node_id, []) if i not in indices])

    def give(self, node_id: int, indices: Iterable[int]) -> None:
        self.set_free(node_id, sorted({*self.free.get(node_id, []), *indices}))

    def set_free(self, node_id: int, indices: list[int]) -> None:
        self.free[node_id] = indices
        position = self._position.get(node_id)
        if indices and position is not None:
            heapq.heappush(self._by_count[len(indices)], position)

    def copy(self) -> Capacity:
        return Capacity(list(self.nodes), {n: list(f) for n, f in self.free.items()}, self.spot_held, held_out=self.held_out, names=self.names)

    def if_healthy(self, held: Iterable[HeldOut]) -> Capacity:
        """This capacity with ``held`` given back: what placement could use were they healthy."""
        nodes = dict(self.nodes)
        free = {n: list(f) for n, f in self.free.items()}
        for h in held:
            nodes.setdefault(h.node, h.name)
            free[h.node] = sorted({*free.get(h.node, []), *h.gpus})
        return Capacity(sorted(nodes.items(), key=lambda n: n[1]), free, self.spot_held)


def held_out_reason(job: WaitingJob, capacity: Capacity) -> str:
    """Why a job that does not fit waits on unhealthy capacity, and who can act: "" unless the
    job would fit were the unhealthy nodes and GPUs it may use healthy."""
    usable = [
        h
        for h in capacity.held_out
        if h.node not in job.exclude_nodes
        and not (job.spot and h.node in capacity.spot_held)
        and (h.whole_node or any((h.node, i) not in job.exclude_gpus for i in h.gpus))
    ]
    if not usable or capacity.if_healthy(usable).first_fit(job) is None:
        return ""
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for h in usable:
        groups[(h.since, h.cause)].append(h.label)
    parts = [
        f"{', '.join(labels)} unhealthy" + (f" since {since}" if since else "") + (f" ({cause})" if cause else "")
        for (since, cause), labels in sorted(groups.items())
    ]
    them = "it" if len(usable) == 1 and (usable[0].whole_node or len(usable[0].gpus) == 1) else "them"
    return f"{'; '.join(parts)}: an operator must mark {them} healthy"


@dataclass(frozen=True)
class SpotRun:
    """A running Spot job's GPUs, which it yields to On-Demand work within quota."""

    job: int
    project: int
    started: float
    gpus: tuple[tuple[int, tuple[int, ...]], ...]  # (node id, indices) per rank


@dataclass
class RoundPlan:
    placements: list[tuple[WaitingJob, list[tuple[int, list[int]]]]] = field(default_factory=list)
    preemptions: dict[int, list[int]] = field(default_factory=dict)  # On-Demand job → Spot jobs to stop
    reasons: dict[int, str] = field(default_factory=dict)  # waiting job → why, with its place in line
    reserved: dict[int, list[int]] = field(default_factory=dict)  # starving job → nodes it holds


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def shape_text(gpus_per_node: int, node_count: int) -> str:
    if gpus_per_node == 0:
        return "a CPU-only slot" if node_count == 1 else f"{node_count} CPU-only nodes"
    gpus = f"{gpus_per_node} GPU{'s' if gpus_per_node != 1 else ''}"
    return gpus if node_count == 1 else f"{node_count} nodes × {gpus}"


def plan_round(
    jobs: Iterable[WaitingJob],
    projects: dict[int, ProjectShare],
    capacity: Capacity,
    *,
    half_life: float,
    spot_runs: list[SpotRun] | None = None,
    max_reservations: int = 1,
    node_names: dict[int, str] | None = None,
) -> RoundPlan:
    """Decide one placement round; ``capacity`` and ``projects`` are updated as jobs are placed.

    Every job passed is visited once, in queue order. Once a job of a shape (GPUs per node, node
    count, Spot or not) cannot fit, later jobs of that shape are not tried this round: capacity
    only shrinks within a round, so they could not fit either (jobs with exclusions have a shape
    of their own). ``spot_runs``: running Spot jobs, offered to On-Demand jobs within their
    project's quota that do not fit.
    """
    names = node_names or {**capacity.names, **dict(capacity.nodes)}
    plan = RoundPlan()
    first: list[WaitingJob] = []
    per_project: dict[int, list[WaitingJob]] = defaultdict(list)
    jobs = list(jobs)
    # Only the oldest few starving jobs jump the line (one reservation each): the bound is on
    # how long a job can wait, not a way for a flood of old jobs to overtake fair share.
    starving = sorted((j for j in jobs if j.starving and not j.yielded_to), key=lambda j: (j.created, j.id))[:max_reservations]
    jumping = {j.id for j in starving}
    for job in jobs:
        (first if job.yielded_to or job.id in jumping else per_project[job.project]).append(job)
    first.sort(key=lambda j: (not j.yielded_to, j.created, j.id))
    for line in per_project.values():
        line.sort(key=lambda j: (-j.priority, j.created, j.id))
    for pid in per_project:
        projects.setdefault(pid, ProjectShare())

    def turn(pid: int, i: int) -> tuple[bool, float, int, int]:
        """Jobs within their project's quota before borrowing ones; then the lower recent use."""
        share, job = projects[pid], per_project[pid][i]
        return (share.used_gpus + job.total_gpus > share.quota, share.key(half_life), pid, i)

    heap = [turn(pid, 0) for pid in per_project]
    heapq.heapify(heap)

    def ordered() -> Iterable[WaitingJob]:
        yield from first
        while heap:
            *_key, pid, i = heapq.heappop(heap)
            yield per_project[pid][i]
            if i + 1 < len(per_project[pid]):
                # The key is read after the job was tried, so a placement pushes the project back.
                heapq.heappush(heap, turn(pid, i + 1))

    blocked: dict[tuple, str] = {}  # shape → why the first job of it did not fit
    in_line: dict[tuple[int, int], int] = defaultdict(int)
    victims_left = sorted(spot_runs or [], key=lambda r: (projects.get(r.project, ProjectShare()).borrowed == 0, -r.started))
    reservations = 0
    quota_holds: set[int] = set()  # projects whose first blocked job within quota holds nodes
    for job in ordered():
        share = projects.setdefault(job.project, ProjectShare())
        shape = (*job.shape, job.spot, job.id if (job.exclude_nodes or job.exclude_gpus) else 0)
        why = ""
        if job.total_gpus == 0 and share.used_cpu_jobs >= share.cpu_job_limit:
            why = f"project at its limit of {share.cpu_job_limit} CPU-only jobs"
        elif job.total_gpus and share.used_gpus + job.total_gpus > share.ceiling:
            limit = "at quota" if share.borrow_limit == 0 else "at its borrowing limit"
            why = f"project {limit} (using {share.used_gpus} of {share.quota} GPUs)"
        elif shape in blocked:
            why = blocked[shape]
        else:
            chosen = capacity.first_fit(job)
            if chosen is not None:
                capacity.take(chosen)
                share.used_gpus += job.total_gpus
                share.used_cpu_jobs += job.total_gpus == 0
                plan.placements.append((job, chosen))
                continue
            waits_on = held_out_reason(job, capacity)
            why = waits_on or "no free capacity fits it"
            if job.exclude_nodes:
                count = len(job.exclude_nodes)
                excluded = ", ".join(sorted(str(names.get(n, n)) for n in job.exclude_nodes))
                if waits_on:
                    why += f"; excluded after faults from {excluded}"
                else:
                    why += (
                        f" on a node it is not excluded from ({count} node{'s' if count != 1 else ''} excluded after faults: "
                        f"{excluded}; an operator marking a node healthy lifts its exclusion)"
                    )
            blocked[shape] = why
            if job.yielded_to:
                why = "Spot jobs preempted for it are saving a checkpoint and stopping"
            elif not job.spot and share.used_gpus + job.total_gpus <= share.quota and victims_left:
                victims = choose_victims(job, capacity, victims_left)
                if victims:
                    plan.preemptions[job.id] = [v.job for v in victims]
                    victims_left = [v for v in victims_left if v not in victims]
                    why = f"within quota: preempting {len(victims)} Spot job{'s' if len(victims) != 1 else ''} to free its GPUs"
            within = share.used_gpus + job.total_gpus <= share.quota
            if job.id in plan.preemptions or job.yielded_to:
                pass
            elif job.id in jumping and reservations < max_reservations:
                held = reserve(job, capacity)
                if held:
                    reservations += 1
                    plan.reserved[job.id] = held
                    why = f"waited past the bound: reserving {', '.join(str(names.get(n, n)) for n in held)} as GPUs free up"
            elif within and job.project not in quota_holds:
                # Guaranteed GPUs: jobs behind it (borrowing ones) do not backfill what it needs,
                # or small jobs would take every GPU freed on its nodes for ever.
                held = reserve(job, capacity)
                if held:
                    quota_holds.add(job.project)
                    plan.reserved[job.id] = held
                    why = f"within quota: reserving {', '.join(str(names.get(n, n)) for n in held)} as GPUs free up"
        in_line[job.shape] += 1
        place = in_line[job.shape]
        where = f"{ordinal(place)} for" if place <= PLACES_SHOWN else f"behind {PLACES_SHOWN}+ jobs for"
        plan.reasons[job.id] = f"{where} {shape_text(*job.shape)}; {why}"
    return plan


def choose_victims(job: WaitingJob, capacity: Capacity, runs: list[SpotRun]) -> list[SpotRun]:
    """The fewest Spot runs, borrowed capacity first and youngest first (``runs``' order), whose
    GPUs together with the free ones fit ``job``; [] if all of them would not do."""
    trial = capacity.copy()
    trial.spot_held = frozenset()
    taken: list[SpotRun] = []
    for run in runs:
        if all(node in job.exclude_nodes for node, _ in run.gpus):
            continue
        for node, indices in run.gpus:
            trial.give(node, indices)
        taken.append(run)
        chosen = trial.first_fit(job)
        if chosen is not None:
            used = {(n, i) for n, idx in chosen for i in idx}
            # Only the runs whose GPUs the placement uses need to yield.
            return [r for r in taken if any((n, i) in used for n, idx in r.gpus for i in idx)]
    return []


def reserve(job: WaitingJob, capacity: Capacity) -> list[int]:
    """Hold the free GPUs of the ``node_count`` nodes closest to fitting ``job`` (most free GPUs,
    then name order), so that younger jobs do not take them while the runs there end."""
    usable = [(-len(capacity.free.get(node, [])), i, node) for i, (node, _name) in enumerate(capacity.nodes) if node not in job.exclude_nodes]
    if len(usable) < job.node_count:
        return []
    held = [node for _f, _i, node in sorted(usable)[: job.node_count]]
    capacity.take((node, list(capacity.free.get(node, []))) for node in held)
    return held
