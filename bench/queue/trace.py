"""A simulated hour of a shared cluster, replayed through the fair-share queue and through plain
FIFO first fit: the same arrivals, durations and node faults for both (standard library and
``jobs.fairshare`` only; no database).

Model: nodes of 8 GPUs; projects with quotas summing to the cluster; each project submits jobs
(1, 2, 4 or 8 GPUs on one node, some 2 × 8) at its own rate, so that demand exceeds capacity and
is not proportional to quota. Durations are log-normal. A placement round runs every ``tick``
seconds. Node faults: a node goes down for ten minutes; its runs go back to the queue and lose
the work since their last periodic checkpoint. Fair share only: Spot runs preempted for
On-Demand work within quota hold their GPUs for the grace period, then go back to the queue
with no work lost (a final checkpoint on SIGTERM).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from jobs.fairshare import Capacity, ProjectShare, SpotRun, WaitingJob, decayed, plan_round

GPUS_PER_NODE = 8
CHECKPOINT_EVERY = 300.0
GRACE = 30.0
FAULT_DOWN = 600.0


@dataclass
class SimJob:
    id: int
    project: int
    gpus: int
    nodes: int
    arrival: float
    work: float  # seconds of running still needed
    spot: bool
    first_start: float | None = None
    run_start: float = 0.0
    alloc: list[tuple[int, list[int]]] = field(default_factory=list)
    stopping_at: float | None = None  # preempted: frees its GPUs then


@dataclass
class Trace:
    nodes: int
    quotas: dict[int, int]
    jobs: list[SimJob]
    faults: list[tuple[float, int]]  # (time, node)
    duration: float
    warmup: float = 600.0  # the first minutes fill the cluster; figures count from then on


def make_trace(*, seed: int, nodes: int, projects: int, duration: float, load: float, burst: int = 200, warmup: float = 600.0) -> Trace:
    """``duration`` seconds measured after ``warmup`` seconds that fill the cluster."""
    rng = random.Random(seed)
    duration += warmup
    capacity = nodes * GPUS_PER_NODE
    # A fifth of the projects get four times the quota of the others; quotas sum to the cluster.
    weights = {p: (4 if p < projects // 5 else 1) for p in range(projects)}
    total = sum(weights.values())
    quotas = {p: capacity * w // total for p, w in weights.items()}
    # Demand per project: log-normal around its quota, so some ask far more than their share.
    appetite = {p: quotas[p] * rng.lognormvariate(0, 0.8) for p in range(projects)}
    scale = load * capacity / sum(appetite.values())
    shapes = [(1, 1, 0.35), (2, 1, 0.25), (4, 1, 0.2), (8, 1, 0.15), (8, 2, 0.05)]
    mean_gpus = sum(g * n * w for g, n, w in shapes)
    mean_work = math.exp(math.log(600) + 0.8**2 / 2)
    jobs: list[SimJob] = []
    for p in range(projects):
        rate = appetite[p] * scale / (mean_gpus * mean_work)  # jobs per second
        t = rng.expovariate(rate)
        while t < duration:
            pick = rng.random()
            for g, n, w in shapes:  # noqa: B007 - picks a shape: g and n are read after the loop
                pick -= w
                if pick <= 0:
                    break
            work = min(rng.lognormvariate(math.log(600), 0.8), 3 * 3600)
            jobs.append(SimJob(len(jobs) + 1, p, g, n, t, work, rng.random() < 0.3))
            t += rng.expovariate(rate)
    # One user of a small project creates a burst of jobs early on (the "200 jobs").
    small = projects - 1
    for _ in range(burst):
        work = min(rng.lognormvariate(math.log(600), 0.8), 3 * 3600)
        jobs.append(SimJob(len(jobs) + 1, small, rng.choice((1, 2, 4)), 1, warmup + rng.uniform(0, 30), work, False))
    jobs.sort(key=lambda j: j.arrival)
    faults = [(rng.uniform(0, duration), rng.randrange(nodes)) for _ in range(int(duration // 600))]
    return Trace(nodes, quotas, jobs, sorted(faults), duration, warmup)


@dataclass
class Outcome:
    used: dict[int, float]  # project → GPU-seconds
    demand: dict[int, float]  # project → GPU-seconds submitted
    waits: list[float]
    other_waits: list[float]  # of the projects other than the one that submitted the burst
    utilisation: float
    preemptions: int
    rounds: int
    round_seconds: float


def simulate(trace: Trace, *, policy: str, tick: float = 10.0, half_life: float = 7200.0, window: int = 20, reserve_after: float = 900.0) -> Outcome:
    import time as clock

    jobs = [SimJob(j.id, j.project, j.gpus, j.nodes, j.arrival, j.work, j.spot) for j in trace.jobs]
    free = {n: list(range(GPUS_PER_NODE)) for n in range(trace.nodes)}
    down_until: dict[int, float] = {}
    waiting: list[SimJob] = []
    running: dict[int, SimJob] = {}
    usage = {p: 0.0 for p in trace.quotas}
    used = {p: 0.0 for p in trace.quotas}
    arrivals = iter(jobs)
    upcoming = next(arrivals, None)
    faults = list(trace.faults)
    waits: list[float] = []
    other_waits: list[float] = []
    burst_project = max(trace.quotas)
    preemptions = 0
    available = 0.0
    spent = 0.0
    rounds = 0
    t = 0.0
    while t < trace.duration:
        # Runs that ended, preempted runs whose grace period is over, faults, recoveries, arrivals.
        for job in list(running.values()):
            if job.stopping_at is not None and job.stopping_at <= t:
                job.work -= job.stopping_at - job.run_start
                release(job, free, running, waiting)
            elif job.stopping_at is None and job.run_start + job.work <= t:
                release(job, free, running, None)
        while faults and faults[0][0] <= t:
            _when, node = faults.pop(0)
            down_until[node] = t + FAULT_DOWN
            for job in [j for j in running.values() if any(n == node for n, _ in j.alloc)]:
                done = t - job.run_start
                job.work -= math.floor(done / CHECKPOINT_EVERY) * CHECKPOINT_EVERY
                release(job, free, running, waiting)
        for node, until in list(down_until.items()):
            if until <= t:
                del down_until[node]
        while upcoming is not None and upcoming.arrival <= t:
            waiting.append(upcoming)
            upcoming = next(arrivals, None)
        # One placement round.
        held = {p: 0 for p in trace.quotas}
        for job in running.values():
            held[job.project] += job.gpus * job.nodes
        capacity = Capacity(
            nodes=[(n, f"n{n:03d}") for n in range(trace.nodes) if n not in down_until],
            free={n: list(free[n]) for n in range(trace.nodes) if n not in down_until},
        )
        started = clock.perf_counter()
        if policy == "fifo":
            placements = fifo_round(waiting, capacity)
        else:
            shares = {p: ProjectShare(quota=q, used_gpus=held[p], usage=usage[p]) for p, q in trace.quotas.items()}
            heads = windowed(waiting, window)
            spot = [
                SpotRun(j.id, j.project, j.run_start, tuple((n, tuple(i)) for n, i in j.alloc)) for j in running.values() if j.spot and j.stopping_at is None
            ]
            yielded = {j.id for j in running.values() if j.stopping_at is not None}
            plan = plan_round(
                [
                    WaitingJob(j.id, j.project, j.gpus, j.nodes, 0, j.arrival, j.spot, starving=t - j.arrival >= reserve_after, yielded_to=j.id in yielded)
                    for j in heads
                ],
                shares,
                capacity,
                half_life=half_life,
                spot_runs=spot,
            )
            by_id = {j.id: j for j in heads}
            placements = [(by_id[w.id], chosen) for w, chosen in plan.placements]
            for victims in plan.preemptions.values():
                for victim in victims:
                    running[victim].stopping_at = t + GRACE
                    preemptions += 1
        spent += clock.perf_counter() - started
        rounds += 1
        for job, chosen in placements:
            waiting.remove(job)
            for node, indices in chosen:
                free[node] = [i for i in free[node] if i not in indices]
            job.alloc, job.run_start = chosen, t
            if job.first_start is None:
                job.first_start = t
                if job.arrival >= trace.warmup:
                    waits.append(t - job.arrival)
                    if job.project != burst_project:
                        other_waits.append(t - job.arrival)
            running[job.id] = job
        # Account the interval to the next round.
        step = min(tick, trace.duration - t)
        counted = step if t >= trace.warmup else 0.0
        for job in running.values():
            used[job.project] += job.gpus * job.nodes * counted
        for p in usage:
            usage[p] = decayed(usage[p], held_gpus=sum(j.gpus * j.nodes for j in running.values() if j.project == p), seconds=step, half_life=half_life)
        available += (trace.nodes - len(down_until)) * GPUS_PER_NODE * counted
        t += tick
    # Jobs never started wait until the end (censored): they count with the time they waited.
    never = [j for j in jobs if j.first_start is None and trace.warmup <= j.arrival < trace.duration]
    waits += [trace.duration - j.arrival for j in never]
    other_waits += [trace.duration - j.arrival for j in never if j.project != burst_project]
    # What each project could have used in the measured hour: its jobs' GPU-seconds within it.
    demand = {p: 0.0 for p in trace.quotas}
    for j in trace.jobs:
        start = max(j.arrival, trace.warmup)
        demand[j.project] += j.gpus * j.nodes * max(0.0, min(j.work - (start - j.arrival), trace.duration - start))
    return Outcome(used, demand, waits, other_waits, sum(used.values()) / available, preemptions, rounds, spent)


def release(job: SimJob, free: dict[int, list[int]], running: dict[int, SimJob], requeue: list[SimJob] | None) -> None:
    for node, indices in job.alloc:
        free[node] = sorted(free[node] + indices)
    job.alloc, job.stopping_at = [], None
    del running[job.id]
    if requeue is not None and job.work > 0:
        requeue.append(job)


def windowed(waiting: list[SimJob], window: int) -> list[SimJob]:
    """Each project's first ``window`` jobs per shape, as the database query gives them."""
    seen: dict[tuple[int, int, int], int] = {}
    heads = []
    for job in sorted(waiting, key=lambda j: (j.arrival, j.id)):
        key = (job.project, job.gpus, job.nodes)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= window:
            heads.append(job)
    return heads


def fifo_round(waiting: list[SimJob], capacity: Capacity) -> list[tuple[SimJob, list[tuple[int, list[int]]]]]:
    """Plain FIFO first fit: oldest first, each job onto the first nodes that fit (backfill)."""
    placements = []
    for job in sorted(waiting, key=lambda j: (j.arrival, j.id)):
        chosen = capacity.first_fit(WaitingJob(job.id, job.project, job.gpus, job.nodes))
        if chosen is not None:
            capacity.take(chosen)
            placements.append((job, chosen))
    return placements


def fair_targets(demand: dict[int, float], quotas: dict[int, int], total: float) -> dict[int, float]:
    """Weighted max-min shares of ``total`` GPU-seconds: by quota, none above its demand."""
    target = {p: 0.0 for p in demand}
    open_ = {p for p in demand if demand[p] > 0}
    left = total
    while open_ and left > 1e-6:
        weight = sum(max(quotas[p], 1) for p in open_)
        share = {p: left * max(quotas[p], 1) / weight for p in open_}
        done = {p for p in open_ if target[p] + share[p] >= demand[p]}
        if not done:
            for p in open_:
                target[p] += share[p]
            break
        for p in done:
            left -= demand[p] - target[p]
            target[p] = demand[p]
        open_ -= done
    return target


def jain(outcome: Outcome, quotas: dict[int, int]) -> float:
    """Jain's index of each project's use over its weighted max-min fair share (1 = perfectly fair)."""
    targets = fair_targets(outcome.demand, quotas, sum(outcome.used.values()))
    xs = [outcome.used[p] / targets[p] for p in targets if targets[p] > 0]
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
