"""Placement in bulk: a round's cost does not grow with the jobs it places or the fleet's size,
a race with another placement falls back without placing a job twice, and every placed job has
its reason, its event and (scale-out) its launch message, sent after commit."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from jobs.models import GPU, AttemptNode, JobAttempt, JobEvent, Node, TrainingJob
from jobs.services import placement
from jobs.services.actions import request_stop
from jobs.services.control import control_round
from jobs.services.messages import LAUNCH_TASK, node_queue
from jobs.services.placement import place_waiting_jobs
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def fleet(nodes: int, gpus: int = 8) -> list[Node]:
    made = Node.objects.bulk_create(Node(name=f"n{i:04d}", address=f"10.0.{i // 250}.{i % 250}") for i in range(nodes))
    GPU.objects.bulk_create(GPU(node=node, index=index) for node in made for index in range(gpus))
    return made


def queue(owner, project, image: str, count: int, **fields) -> list[TrainingJob]:
    return TrainingJob.objects.bulk_create(
        TrainingJob(name=f"q{i}", owner=owner, project=project, image=image, command="true", **{"gpus_per_node": 1, **fields}) for i in range(count)
    )


def held(job: TrainingJob) -> list[tuple[str, int]]:
    return sorted(GPU.objects.filter(allocated_to__attempt__job=job).values_list("node__name", "index"))


def test_a_rounds_queries_do_not_grow_with_the_jobs_it_places_or_the_nodes(owner, project, default_image, settings):
    settings.QUEUE_WINDOW = 500
    counts = {}
    for jobs, nodes in [(10, 10), (200, 30), (10, 500), (200, 500)]:
        for model in (AttemptNode, JobAttempt, JobEvent, TrainingJob, GPU, Node):
            model.objects.all().delete()
        fleet(nodes)
        waiting = queue(owner, project, default_image.reference, jobs)
        with CaptureQueriesContext(connection) as queries:
            placed = place_waiting_jobs()
        assert len(placed) == jobs
        assert JobEvent.objects.filter(job__in=waiting, actor="placement").count() == jobs
        counts[(jobs, nodes)] = len(queries)
    # PostgreSQL: the same statements whatever the numbers. SQLite binds at most 999 parameters
    # per statement, so Django splits the three bulk inserts of 200 rows into a few (about one
    # more statement per 50 attempts); the round's own statements stay the same.
    slack = 2 if connection.vendor == "postgresql" else 10
    assert max(counts.values()) - min(counts.values()) <= slack, counts
    assert counts[(200, 500)] < 40, counts  # one-by-one holds took ~7 statements per job


def take_gpu_after_reading(monkeypatch, node_name: str, index: int, intruder: AttemptNode, *, thread: bool = False) -> None:
    """Between the round's read of the free GPUs and its claim, another placement takes one."""
    real = placement.read_capacity

    def take() -> None:
        try:
            GPU.objects.filter(node__name=node_name, index=index).update(allocated_to=intruder)
        finally:
            if thread:
                connection.close()

    def read_then_race(now):
        result = real(now)
        if thread:
            other = threading.Thread(target=take)
            other.start()
            other.join()
        else:
            take()
        return result

    monkeypatch.setattr(placement, "read_capacity", read_then_race)


def intruder_part(make_job, node_name: str) -> AttemptNode:
    other = make_job(name="intruder")
    attempt = JobAttempt.objects.create(job=other, number=1)
    return AttemptNode.objects.create(attempt=attempt, node=Node.objects.get(name=node_name), rank=0, gpu_indices=[0])


@pytest.mark.slow  # threads racing for the database
def test_a_gpu_taken_between_reading_and_claiming_rolls_the_batch_back_and_holds_the_rest_one_by_one(nodes, make_job, monkeypatch):
    intruder = intruder_part(make_job, "node-a")
    first, second, third = (make_job(gpus_per_node=1) for _ in range(3))
    take_gpu_after_reading(monkeypatch, "node-a", 0, intruder)
    placed = place_waiting_jobs()
    assert sorted(a.job_id for a in placed) == [second.pk, third.pk]
    assert (held(first), held(second), held(third)) == ([], [("node-a", 1)], [("node-a", 2)])
    assert GPU.objects.get(node__name="node-a", index=0).allocated_to == intruder
    first.refresh_from_db()
    assert first.status == JobStatus.PENDING and not first.status_reason.startswith("placed")
    assert not JobAttempt.objects.filter(job=first).exists()
    assert not JobEvent.objects.filter(job=first, actor="placement").exists()  # the batch's event rolled back

    monkeypatch.undo()
    [again] = place_waiting_jobs()
    assert again.job_id == first.pk and held(first) == [("node-a", 3)]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow  # threads racing for the database
@pytest.mark.database
def test_on_postgresql_a_claim_committed_by_another_connection_makes_the_batch_fall_back(nodes, make_job, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("two connections racing on row locks: PostgreSQL (the suite's second pass)")
    intruder = intruder_part(make_job, "node-a")
    jobs = [make_job(gpus_per_node=1) for _ in range(3)]
    take_gpu_after_reading(monkeypatch, "node-a", 0, intruder, thread=True)
    placed = place_waiting_jobs()
    assert sorted(a.job_id for a in placed) == [jobs[1].pk, jobs[2].pk]
    assert GPU.objects.get(node__name="node-a", index=0).allocated_to == intruder
    assert [held(job) for job in jobs] == [[], [("node-a", 1)], [("node-a", 2)]]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow  # threads racing for the database
@pytest.mark.database
def test_on_postgresql_two_placements_at_once_place_each_job_once(nodes, make_job, monkeypatch):
    if connection.vendor != "postgresql":
        pytest.skip("two connections racing on row locks: PostgreSQL (the suite's second pass)")
    jobs = [make_job(gpus_per_node=2) for _ in range(5)]
    real = placement.read_capacity
    both_read = threading.Barrier(2, timeout=60)

    def read_together(now):
        result = real(now)  # both rounds see the same free GPUs and plan the same holds
        both_read.wait()
        return result

    monkeypatch.setattr(placement, "read_capacity", read_together)
    results: list[list] = []
    errors: list[BaseException] = []

    def round_in_thread() -> None:
        try:
            results.append(list(place_waiting_jobs()))
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            connection.close()

    rounds = [threading.Thread(target=round_in_thread) for _ in range(2)]
    for thread in rounds:
        thread.start()
    for thread in rounds:
        thread.join()
    assert not errors, errors
    assert sorted(len(r) for r in results) == [0, 5]  # one round holds them all; the other none
    for job in jobs:
        assert JobAttempt.objects.filter(job=job).count() == 1
        assert len(held(job)) == 2
    assert GPU.objects.filter(allocated_to__isnull=False).count() == 10


def test_a_job_stopped_after_the_round_read_it_gets_no_attempt(nodes, make_job, owner, monkeypatch):
    jobs = [make_job(gpus_per_node=1) for _ in range(3)]
    real = placement.read_capacity

    def read_then_stop(now):
        result = real(now)
        request_stop(jobs[1], actor=owner.username)
        return result

    monkeypatch.setattr(placement, "read_capacity", read_then_stop)
    placed = place_waiting_jobs()
    assert sorted(a.job_id for a in placed) == [jobs[0].pk, jobs[2].pk]
    jobs[1].refresh_from_db()
    assert jobs[1].status == JobStatus.STOPPED
    assert not JobAttempt.objects.filter(job=jobs[1]).exists() and held(jobs[1]) == []


def launches_sent(names: list[str]) -> dict[str, list[int]]:
    """The launch messages waiting on each node's queue (the embedded Celery broker, in memory)."""
    from console.celery import app

    sent: dict[str, list[int]] = {}
    with app.connection_for_read() as conn:
        for name in names:
            while (message := conn.default_channel.basic_get(node_queue(name), no_ack=True)) is not None:
                assert message.headers["task"] == LAUNCH_TASK
                sent.setdefault(name, []).extend(message.decode()[0])
    return sent


def test_every_placed_job_has_its_reason_its_event_and_its_launch_message_after_commit(nodes, make_job, settings, django_capture_on_commit_callbacks):
    settings.SCALE_OUT = True
    names = [n.name for n in nodes]
    launches_sent(names)  # whatever an earlier test left
    singles = [make_job(gpus_per_node=1) for _ in range(4)]
    pair = make_job(gpus_per_node=2, node_count=2)
    with django_capture_on_commit_callbacks(execute=True):
        placed = place_waiting_jobs()
        assert launches_sent(names) == {}  # nothing leaves before commit
    assert len(placed) == 5
    sent = launches_sent(names)
    by_job = {a.job_id: a for a in placed}
    for job in [*singles, pair]:
        job.refresh_from_db()
        attempt = by_job[job.pk]
        assert job.status == JobStatus.PENDING and job.status_reason.startswith("placed on ")
        event = JobEvent.objects.get(job=job, actor="placement")
        assert (event.reason, event.attempt, event.from_status, event.to_status) == (job.status_reason, 1, "Pending", "Pending")
        queues = sorted(name for name, ids in sent.items() if attempt.pk in ids)
        assert queues == sorted(attempt.placements.values_list("node__name", flat=True))
    assert sorted(n for ids in sent.values() for n in ids) == sorted(a.pk for a in placed for _ in range(a.placements.count()))


def test_the_control_round_goes_on_placing_past_a_full_window(nodes, make_job, settings):
    settings.QUEUE_WINDOW = 3
    settings.QUEUE_ROUND_BUDGET = 600.0  # the test asserts the rounds, not their speed
    jobs = [make_job(gpus_per_node=1) for _ in range(10)]
    assert len(place_waiting_jobs()) == 3  # one round: one window
    assert len(control_round()) == 7  # the rest, round after round, in the same control round
    assert all(held(job) for job in jobs)


def test_a_control_round_out_of_budget_places_one_window(nodes, make_job, settings):
    settings.QUEUE_WINDOW = 3
    settings.QUEUE_ROUND_BUDGET = 0.0
    for _ in range(10):
        make_job(gpus_per_node=1)
    assert len(control_round()) == 3
