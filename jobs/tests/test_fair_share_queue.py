"""The fair-share queue: no clog, quota shares, places in line, bounded waits for large jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.utils import timezone

from jobs.backends.facts import exited
from jobs.models import GPU, JobAttempt, Project, TrainingJob
from jobs.services.lifecycle import transition
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import record_exit
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def queued_before_the_cluster_shrank(make_job, count: int, gpus_per_node: int) -> None:
    """Jobs no node can hold now (creation refuses such a shape): queued while one could."""
    jobs = [make_job(gpus_per_node=1) for _ in range(count)]
    TrainingJob.objects.filter(pk__in=[job.pk for job in jobs]).update(gpus_per_node=gpus_per_node)


def user_in(name: str, project: Project):
    user = get_user_model().objects.create_user(name, password="pw")
    project.members.add(user)
    return user


def held_by_project(project: Project) -> int:
    return GPU.objects.filter(allocated_to__attempt__job__project=project).count()


def finish(job) -> None:
    attempt = JobAttempt.objects.get(job=job, state__in=["placed", "running"])
    transition(job.pk, JobStatus.RUNNING, expected={JobStatus.PENDING})
    record_exit(attempt, exited(0, None))


def test_two_hundred_jobs_no_node_can_hold_do_not_block_a_placeable_one(nodes, make_job, owner):
    other = Project.objects.create(name="other")
    queued_before_the_cluster_shrank(make_job, 200, gpus_per_node=5)
    small = make_job(gpus_per_node=1, owner=user_in("second", other), project=other)
    place_waiting_jobs()
    assert JobAttempt.objects.filter(job=small).exists()
    small.refresh_from_db()
    assert small.status_reason.startswith("placed on node-a GPU 0")


def test_a_burst_of_impossible_jobs_in_the_same_project_does_not_block_its_small_job(nodes, make_job, settings):
    settings.QUEUE_MAX_WAITING_PER_USER = 500
    queued_before_the_cluster_shrank(make_job, 200, gpus_per_node=5)
    small = make_job(gpus_per_node=1)
    place_waiting_jobs()
    assert JobAttempt.objects.filter(job=small).exists()


def test_two_projects_submitting_the_same_burst_get_their_quota_shares(nodes, make_job):
    big = Project.objects.create(name="big", gpu_quota=8)
    small = Project.objects.create(name="small", gpu_quota=4)
    users = {big: user_in("b", big), small: user_in("s", small)}
    bursts = {p: [make_job(owner=users[p], project=p, gpus_per_node=1) for _ in range(30)] for p in (big, small)}
    place_waiting_jobs()
    assert (held_by_project(big), held_by_project(small)) == (8, 4)
    # Jobs end in turn, the same number from each project; the freed GPUs go back by share.
    for round_no in range(6):
        for project in (big, small):
            running = [j for j in bursts[project] if JobAttempt.objects.filter(job=j, state="placed").exists()]
            finish(running[0])
        place_waiting_jobs()
        assert (held_by_project(big), held_by_project(small)) == (8, 4), f"after round {round_no}"


def test_projects_without_quotas_share_evenly(nodes, make_job):
    one, two = Project.objects.create(name="one"), Project.objects.create(name="two")
    for project, name in ((one, "u1"), (two, "u2")):
        user = user_in(name, project)
        for _ in range(10):
            make_job(owner=user, project=project, gpus_per_node=1)
    place_waiting_jobs()
    assert (held_by_project(one), held_by_project(two)) == (6, 6)


def test_each_waiting_job_says_its_place_in_line_and_why(nodes, make_job, project):
    for _ in range(3):
        make_job(gpus_per_node=4)
    waiting = [make_job(gpus_per_node=2) for _ in range(3)]
    place_waiting_jobs()
    reasons = [Job.status_reason for Job in (w.__class__.objects.get(pk=w.pk) for w in waiting)]
    assert reasons == [
        "1st for 2 GPUs; no free capacity fits it",
        "2nd for 2 GPUs; no free capacity fits it",
        "3rd for 2 GPUs; no free capacity fits it",
    ]


def test_a_project_at_its_quota_without_borrowing_waits_with_that_reason(nodes, make_job):
    capped = Project.objects.create(name="capped", gpu_quota=2, gpu_borrow_limit=0)
    user = user_in("c", capped)
    jobs = [make_job(owner=user, project=capped, gpus_per_node=1) for _ in range(3)]
    place_waiting_jobs()
    third = jobs[2].__class__.objects.get(pk=jobs[2].pk)
    assert third.status_reason == "1st for 1 GPU; project at quota (using 2 of 2 GPUs)"
    assert held_by_project(capped) == 2


def test_borrowing_stops_at_the_borrow_limit(nodes, make_job):
    team = Project.objects.create(name="team", gpu_quota=2, gpu_borrow_limit=3)
    user = user_in("t", team)
    for _ in range(8):
        make_job(owner=user, project=team, gpus_per_node=1)
    place_waiting_jobs()
    assert held_by_project(team) == 5


def test_cpu_only_jobs_are_capped_per_project(nodes, make_job, settings):
    settings.QUEUE_CPU_JOBS_PER_PROJECT = 3
    jobs = [make_job(gpus_per_node=0) for _ in range(5)]
    place_waiting_jobs()
    assert JobAttempt.objects.filter(job__in=jobs).count() == 3
    last = jobs[4].__class__.objects.get(pk=jobs[4].pk)
    assert last.status_reason == "2nd for a CPU-only slot; project at its limit of 3 CPU-only jobs"


def test_a_starving_eight_gpu_job_reserves_a_node_and_is_placed_within_its_bound(db, settings, make_job):
    from agent.inventory import register_nodes, simulated_nodes

    settings.SIMULATED_NODES, settings.SIMULATED_GPUS_PER_NODE = 1, 8
    register_nodes(simulated_nodes(), agent="embedded")
    settings.QUEUE_RESERVE_AFTER = 600
    start = timezone.now()
    with time_machine.travel(start, tick=False) as clock:
        smalls = [make_job(gpus_per_node=1) for _ in range(4)]
        place_waiting_jobs()
        big = make_job(gpus_per_node=8)
        # A stream of small jobs: every minute one ends and a new one comes and takes a free GPU.
        placed_at = None
        for minute in range(1, 40):
            clock.shift(timedelta(minutes=1))
            active = [j for j in smalls if JobAttempt.objects.filter(job=j, state="placed").exists()]
            if active:
                finish(active[0])
            smalls.append(make_job(gpus_per_node=1))
            place_waiting_jobs()
            if JobAttempt.objects.filter(job=big).exists():
                placed_at = minute
                break
            big.refresh_from_db()
            if minute == 5:
                assert big.status_reason == "1st for 8 GPUs; no free capacity fits it"
            if minute == 11:
                assert big.status_reason == "1st for 8 GPUs; waited past the bound: reserving node-a as GPUs free up"
    # Reserved after 10 minutes; the four small runs then on the node end one a minute.
    assert placed_at is not None and placed_at <= 10 + 8, placed_at
    assert GPU.objects.filter(allocated_to__attempt__job=big).count() == 8
