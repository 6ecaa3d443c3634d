"""Spot runs yield their GPUs to On-Demand work within quota, and resume from their checkpoint."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model

from harness.job_factory import job_output
from harness.node_agent import pump_until
from jobs.fairshare import Capacity, ProjectShare, SpotRun, WaitingJob, plan_round
from jobs.models import JobAttempt, JobEvent, Project
from jobs.services.actions import request_stop
from jobs.statuses import JobStatus

TRAINING = "python -m jobs.examples.train_ckpt --steps 100000 --save-every 10 --sleep 0.05"
COMMIT = re.compile(r"\[Concurrent Checkpoint\] committed step=(\d+)")


def run_until(agent, condition, *, timeout: float = 90.0, what: str) -> None:
    pump_until(agent, condition, what, timeout=timeout)


def texts(job) -> list[str]:
    return job_output(job, stream="master")


def flow(job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).status_changes().order_by("id").values_list("to_status", flat=True))


@pytest.mark.django_db
@pytest.mark.slow
def test_borrowed_spot_capacity_is_returned_to_on_demand_work_and_the_spot_job_resumes(make_job, agent, owner):
    spot_project = Project.objects.create(name="spotters")  # no quota: everything it runs is borrowed
    spot_project.members.add(owner)
    team = Project.objects.create(name="team", gpu_quota=4)
    member = get_user_model().objects.create_user("member", password="pw")
    team.members.add(member)

    spots = [make_job(command=TRAINING, job_type="Spot", gpus_per_node=4, project=spot_project) for _ in range(3)]
    run_until(agent, lambda: all(any(COMMIT.search(t) for t in texts(s)) for s in spots), what="a checkpoint from every Spot job")
    youngest = max(spots, key=lambda s: JobAttempt.objects.get(job=s).started_at)

    urgent = make_job(command="python -c \"import time; print('on demand', flush=True); time.sleep(600)\"", gpus_per_node=4, project=team, owner=member)
    run_until(agent, lambda: JobAttempt.objects.filter(job=urgent, state="running").exists(), what="the On-Demand job running")

    youngest.refresh_from_db()
    first = JobAttempt.objects.get(job=youngest, number=1)
    assert first.preempted_for_id == urgent.pk and first.reclaimed
    assert youngest.status == JobStatus.PENDING and youngest.failover_count == 0
    yielded = JobEvent.objects.get(job=youngest, from_status=JobStatus.RUNNING, to_status=JobStatus.PENDING)
    assert yielded.reason.startswith(f"preempted for On-Demand job {urgent.name} (team, within its quota); ")
    others = [s for s in spots if s != youngest]
    assert all(JobAttempt.objects.get(job=s).state == "running" for s in others)
    placed_on = JobAttempt.objects.get(job=urgent).placements.get().node
    assert placed_on == first.placements.get().node

    # The On-Demand job ends; the preempted Spot job comes back from its latest checkpoint.
    request_stop(urgent, actor="member")
    run_until(agent, lambda: JobAttempt.objects.filter(job=youngest, number=2, state="running").exists(), what="the Spot job resumed")
    second = JobAttempt.objects.get(job=youngest, number=2)
    assert second.resume_step is not None and second.resume_step > 0
    run_until(agent, lambda: f"Resumed from checkpoint step {second.resume_step}" in texts(youngest), what="the resume line")
    youngest.refresh_from_db()
    assert flow(youngest)[:4] == ["Pending", "Running", "Pending", "Running"]
    assert youngest.failover_count == 0
    resumed = JobEvent.objects.filter(job=youngest, to_status=JobStatus.RUNNING).order_by("id").last()
    assert f"after preempted for On-Demand job {urgent.name}" in resumed.reason
    assert f"resuming from checkpoint step {second.resume_step}" in resumed.reason
    for job in spots:
        request_stop(job, actor="owner")
    run_until(agent, lambda: all(JobAttempt.objects.filter(job=s).exclude(state="exited").count() == 0 for s in spots), what="the Spot jobs stopped")


def test_borrowed_spot_runs_yield_before_those_within_quota_and_the_youngest_first():
    capacity = Capacity(nodes=[(1, "a"), (2, "b"), (3, "c")], free={1: [], 2: [], 3: []})
    projects = {10: ProjectShare(quota=4, used_gpus=4), 20: ProjectShare(quota=0, used_gpus=8), 30: ProjectShare(quota=4)}
    runs = [
        SpotRun(job=1, project=10, started=300.0, gpus=((1, (0, 1, 2, 3)),)),  # within its quota, youngest
        SpotRun(job=2, project=20, started=100.0, gpus=((2, (0, 1, 2, 3)),)),  # borrowed, older
        SpotRun(job=3, project=20, started=200.0, gpus=((3, (0, 1, 2, 3)),)),  # borrowed, younger
    ]
    waiting = [WaitingJob(id=99, project=30, gpus_per_node=4, node_count=1)]
    plan = plan_round(waiting, projects, capacity, half_life=3600, spot_runs=runs)
    assert plan.preemptions == {99: [3]}
    assert plan.reasons[99] == "1st for 4 GPUs; within quota: preempting 1 Spot job to free its GPUs"


def test_a_spot_job_or_one_beyond_its_quota_preempts_nothing():
    capacity = Capacity(nodes=[(1, "a")], free={1: []})
    runs = [SpotRun(job=1, project=20, started=1.0, gpus=((1, (0, 1)),))]
    projects = {20: ProjectShare(used_gpus=2), 30: ProjectShare(quota=1)}
    waiting = [WaitingJob(id=98, project=30, gpus_per_node=2, node_count=1), WaitingJob(id=97, project=30, gpus_per_node=1, node_count=1, spot=True)]
    plan = plan_round(waiting, projects, capacity, half_life=3600, spot_runs=runs)
    assert plan.preemptions == {}
