"""The free-GPU index behind ``Capacity.first_fit`` gives the same first fit by node name as
walking every node, through any sequence of holds and releases."""

from __future__ import annotations

import random

from jobs.fairshare import Capacity, WaitingJob, plan_round


def walked_first_fit(capacity: Capacity, job: WaitingJob):
    for node_id, _name in capacity.nodes:
        free = capacity.free.get(node_id, [])
        if len(free) >= job.gpus_per_node:
            return [(node_id, free[: job.gpus_per_node])]
    return None


def test_the_index_finds_the_same_node_as_walking_the_fleet_through_holds_and_releases():
    rng = random.Random(18)
    nodes = [(i, f"node-{i:03d}") for i in rng.sample(range(1000), 120)]
    nodes.sort(key=lambda n: n[1])
    capacity = Capacity(nodes=nodes, free={n: list(range(8)) for n, _ in nodes})
    held = []
    for step in range(3000):
        if held and rng.random() < 0.4:
            node_id, indices = held.pop(rng.randrange(len(held)))
            capacity.give(node_id, indices)
            continue
        job = WaitingJob(id=step, project=1, gpus_per_node=rng.choice([1, 1, 2, 4, 8]), node_count=1)
        chosen = capacity.first_fit(job)
        assert chosen == walked_first_fit(capacity, job)
        if chosen:
            capacity.take(chosen)
            held.extend(chosen)


def test_a_round_on_a_busy_thousand_node_fleet_places_on_the_first_free_nodes_by_name():
    nodes = [(i, f"node-{i:04d}") for i in range(1000)]
    free = {i: ([] if i < 990 else list(range(8))) for i in range(1000)}
    free[5] = [3]  # one GPU free early in the line
    jobs = [WaitingJob(id=k, project=1, gpus_per_node=1, node_count=1, created=k) for k in range(20)]
    plan = plan_round(jobs, {}, Capacity(nodes=nodes, free=free), half_life=3600)
    placed = [chosen for _job, chosen in plan.placements]
    assert placed[0] == [(5, [3])]
    assert placed[1:9] == [[(990, [i])] for i in range(8)]
    assert len(placed) == 20
