from __future__ import annotations

import pytest

from jobs.backends.facts import exited
from jobs.models import GPU, JobAttempt, Node, TrainingJob
from jobs.services.lifecycle import transition
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import record_exit
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def held_by(job) -> list[tuple[str, int]]:
    return sorted(GPU.objects.filter(allocated_to__attempt__job=job).values_list("node__name", "index"))


def test_it_places_first_fit_over_nodes_in_name_order(nodes, make_job):
    first = make_job(gpus_per_node=3)
    second = make_job(gpus_per_node=2)
    place_waiting_jobs()
    assert held_by(first) == [("node-a", 0), ("node-a", 1), ("node-a", 2)]
    assert held_by(second) == [("node-b", 0), ("node-b", 1)]


def test_a_job_that_does_not_fit_waits_with_a_reason_and_is_placed_when_capacity_frees(nodes, make_job):
    big = [make_job(gpus_per_node=4) for _ in range(3)]
    waiting = make_job(gpus_per_node=2)
    place_waiting_jobs()
    waiting.refresh_from_db()
    assert waiting.status == JobStatus.PENDING
    assert waiting.status_reason == "1st for 2 GPUs; no free capacity fits it"
    assert not JobAttempt.objects.filter(job=waiting).exists()

    finished = JobAttempt.objects.get(job=big[1])
    transition(big[1].pk, JobStatus.RUNNING)
    record_exit(finished, exited(0, None))
    place_waiting_jobs()
    assert held_by(waiting) == [("node-b", 0), ("node-b", 1)]


def test_older_jobs_are_placed_first(nodes, make_job):
    jobs = [make_job(gpus_per_node=4) for _ in range(4)]
    place_waiting_jobs()
    placed = set(JobAttempt.objects.values_list("job_id", flat=True))
    assert placed == {j.pk for j in jobs[:3]}


def test_cordoned_unhealthy_and_not_ready_nodes_get_no_jobs(nodes, make_job):
    Node.objects.filter(name="node-a").update(cordoned=True)
    Node.objects.filter(name="node-b").update(healthy=False)
    Node.objects.filter(name="node-c").update(state=Node.State.NOT_READY)
    job = make_job(gpus_per_node=1)
    place_waiting_jobs()
    assert held_by(job) == []
    Node.objects.filter(name="node-c").update(state=Node.State.READY)
    place_waiting_jobs()
    assert held_by(job) == [("node-c", 0)]


def test_an_unhealthy_gpu_is_skipped(nodes, make_job):
    GPU.objects.filter(node__name="node-a", index=0).update(healthy=False)
    job = make_job(gpus_per_node=1)
    place_waiting_jobs()
    assert held_by(job) == [("node-a", 1)]


def test_a_multi_node_job_gets_distinct_nodes_with_ranks(nodes, make_job):
    job = make_job(gpus_per_node=2, node_count=2)
    place_waiting_jobs()
    attempt = JobAttempt.objects.get(job=job)
    parts = list(attempt.placements.order_by("rank").values_list("rank", "node__name", "gpu_indices"))
    assert parts == [(0, "node-a", [0, 1]), (1, "node-b", [0, 1])]


def test_a_job_asking_more_gpus_than_any_node_has_keeps_waiting(nodes, make_job):
    # Queued while a larger node was registered: creation refuses such a shape now.
    job = make_job(gpus_per_node=4)
    TrainingJob.objects.filter(pk=job.pk).update(gpus_per_node=8)
    place_waiting_jobs()
    job.refresh_from_db()
    assert (job.status, job.status_reason) == (JobStatus.PENDING, "1st for 8 GPUs; no free capacity fits it")


def test_a_placed_job_is_not_placed_twice(nodes, make_job):
    job = make_job(gpus_per_node=1)
    place_waiting_jobs()
    place_waiting_jobs()
    assert JobAttempt.objects.filter(job=job).count() == 1
    assert len(held_by(job)) == 1


def test_placement_queries_do_not_grow_with_the_queue(nodes, make_job, django_assert_max_num_queries):
    for _ in range(30):
        make_job(gpus_per_node=4)
    # 3 fit; 27 wait. Queries: 6 reads, 3 placements (~6 each), one reason update per waiter.
    with django_assert_max_num_queries(6 + 3 * 6 + 27 + 5):
        place_waiting_jobs()
