"""Benchmark: the fair-share queue.

    python -m bench.queue [--rounds 7] [--sizes 1000,10000,20000] [--trace-seed 1]

1. **A placement round** on a throw-away SQLite console: 100 simulated nodes × 8 GPUs, 50
   projects (quota 16 GPUs each), the cluster full but for one node freed per round, and 1,000 /
   10,000 / 20,000 waiting jobs (1, 2, 4 or 8 GPUs; random priorities and ages). Each measured
   round runs inside a transaction that is rolled back, so every round starts from the same
   state. Printed: time per round (median, min–max) and queries per round, and the ratio to the
   1,000-job round; both stay flat beyond the window (QUEUE_WINDOW jobs per project and shape).
2. **A simulated hour** (``bench.queue.trace``): the same arrivals, durations and node faults
   replayed through the fair-share queue and through plain FIFO first fit: Jain's fairness index
   of per-project use against the quota-weighted max-min fair share, GPU utilisation, p95 queue
   wait, preemptions, and the policy's own time per round.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time

from bench.list.__main__ import setup_django  # the same embedded set-up: SQLite in a temporary directory, migrated

NODES, GPUS, PROJECTS = 100, 8, 50


def build_cluster() -> list:
    """Nodes, GPUs, projects with owners, and one 8-GPU run holding each node."""
    from django.contrib.auth.models import User
    from django.utils import timezone

    from jobs.models import GPU, AttemptNode, Image, JobAttempt, Node, Project, TrainingJob
    from jobs.statuses import JobStatus

    Image.objects.get_or_create(reference="pytorch:2.13-py3.11", defaults={"runtime": sys.prefix})
    nodes = Node.objects.bulk_create(Node(name=f"node-{i:03d}", simulated=True, agent="bench") for i in range(NODES))
    GPU.objects.bulk_create(GPU(node=n, index=i) for n in nodes for i in range(GPUS))
    users = User.objects.bulk_create(User(username=f"user-{p:02d}") for p in range(PROJECTS))
    projects = Project.objects.bulk_create(Project(name=f"project-{p:02d}", gpu_quota=NODES * GPUS // PROJECTS) for p in range(PROJECTS))
    now = timezone.now()
    holders = TrainingJob.objects.bulk_create(
        TrainingJob(
            name=f"holder-{i:03d}",
            owner=users[i % PROJECTS],
            project=projects[i % PROJECTS],
            image="pytorch:2.13-py3.11",
            command="python train.py",
            gpus_per_node=GPUS,
            status=JobStatus.RUNNING,
            started_at=now,
        )
        for i in range(NODES)
    )
    attempts = JobAttempt.objects.bulk_create(JobAttempt(job=j, number=1, state=JobAttempt.State.RUNNING, started_at=now) for j in holders)
    parts = AttemptNode.objects.bulk_create(AttemptNode(attempt=a, node=n, rank=0, gpu_indices=list(range(GPUS))) for a, n in zip(attempts, nodes, strict=True))
    for part, node in zip(parts, nodes, strict=True):
        GPU.objects.filter(node=node).update(allocated_to=part)
    return list(zip(users, projects, strict=True))


def add_waiting(members: list, count: int, start: int) -> None:
    from django.utils import timezone

    from jobs.models import TrainingJob

    rng = random.Random(start)
    now = timezone.now()
    TrainingJob.objects.bulk_create(
        (
            TrainingJob(
                name=f"wait-{i:06d}",
                owner=members[i % PROJECTS][0],
                project=members[i % PROJECTS][1],
                image="pytorch:2.13-py3.11",
                command="python train.py",
                gpus_per_node=rng.choice((1, 1, 2, 4, 8)),
                priority=rng.choice((0, 0, 0, 1, -1)),
                created_at=now - timezone.timedelta(seconds=rng.uniform(0, 600)),
            )
            for i in range(start, start + count)
        ),
        batch_size=2000,
    )


def measure_rounds(rounds: int) -> tuple[list[float], list[int], int]:
    """Rounds that each free one node (its holder ended) and place; rolled back after each."""
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    from jobs.models import GPU, Node
    from jobs.services.placement import place_waiting_jobs

    times, queries, placed = [], [], 0
    names = list(Node.objects.order_by("name").values_list("name", flat=True))
    for r in range(rounds):
        with transaction.atomic():
            GPU.objects.filter(node__name=names[r % len(names)]).update(allocated_to=None)
            with CaptureQueriesContext(connection) as ctx:
                started = time.perf_counter()
                placed += len(place_waiting_jobs())
                times.append(time.perf_counter() - started)
            queries.append(len(ctx.captured_queries))
            transaction.set_rollback(True)
    return times, queries, placed


def placement_rounds(sizes: list[int], rounds: int) -> None:
    from django.conf import settings

    from jobs.services.placement import place_waiting_jobs

    members = build_cluster()
    print(
        f"placement round: {NODES} nodes × {GPUS} GPUs, {PROJECTS} projects, cluster full but one node freed per round, "
        f"QUEUE_WINDOW={settings.QUEUE_WINDOW}, {rounds} rounds each (rolled back), SQLite"
    )
    print(f"{'waiting':>8}{'median ms':>11}{'min':>8}{'max':>8}{'queries':>9}{'placed/rnd':>11}{'ratio':>7}{'q ratio':>8}{'first rnd ms':>13}")
    added, base = 0, None
    for size in sizes:
        add_waiting(members, size - added, added)
        added = size
        started = time.perf_counter()
        place_waiting_jobs()  # the round that writes every waiting reason once; then the steady rounds
        first = (time.perf_counter() - started) * 1000
        times, queries, placed = measure_rounds(rounds)
        med, q = statistics.median(times) * 1000, statistics.median(queries)
        base = base or (med, q)
        print(
            f"{size:>8}{med:>11.1f}{min(times) * 1000:>8.1f}{max(times) * 1000:>8.1f}{q:>9.0f}{placed / rounds:>11.1f}"
            f"{med / base[0]:>7.2f}{q / base[1]:>8.2f}{first:>13.0f}"
        )


def trace_run(seed: int, nodes: int, projects: int, load: float, burst: int) -> None:
    from bench.queue.trace import jain, make_trace, simulate
    from bench.stats import quantile

    trace = make_trace(seed=seed, nodes=nodes, projects=projects, duration=3600.0, load=load, burst=burst)
    print(
        f"\nsimulated hour: {nodes} nodes × 8 GPUs, {projects} projects (quotas {min(trace.quotas.values())}–"
        f"{max(trace.quotas.values())} GPUs), {len(trace.jobs)} jobs (30% Spot), offered load {load:.1f}× capacity, "
        f"a burst of {burst} jobs from the smallest project at its start, after 10 min of warm-up; {len(trace.faults)} node faults (10 min each), "
        f"rounds every 10 s, seed {seed}"
    )
    print(f"{'policy':<22}{'Jain':>7}{'GPU util':>10}{'p50 wait s':>12}{'p95 wait s':>12}{'p95 others':>12}{'preempted':>11}{'ms/round':>10}")
    for name, policy in (("fair share (this)", "fair"), ("FIFO first fit", "fifo")):
        out = simulate(trace, policy=policy)
        print(
            f"{name:<22}{jain(out, trace.quotas):>7.3f}{out.utilisation:>10.1%}{quantile(out.waits, 0.5):>12.0f}"
            f"{quantile(out.waits, 0.95):>12.0f}{quantile(out.other_waits, 0.95):>12.0f}{out.preemptions:>11}{out.round_seconds / out.rounds * 1000:>10.2f}"
        )


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--sizes", default="1000,10000,20000")
    parser.add_argument("--trace-seed", type=int, default=1)
    parser.add_argument("--trace-nodes", type=int, default=NODES)
    parser.add_argument("--trace-projects", type=int, default=20)
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--skip-rounds", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        setup_django(directory)
        if not args.skip_rounds:
            placement_rounds([int(s) for s in args.sizes.split(",")], args.rounds)
        trace_run(args.trace_seed, args.trace_nodes, args.trace_projects, args.load, args.burst)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    raise SystemExit(main())
