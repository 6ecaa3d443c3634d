"""Every Job Failover flow end to end on the embedded agent with simulated GPUs."""

from __future__ import annotations

import gc
import re
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from failover.services.faults import inject_fault, reclaim_spot
from harness.job_factory import job_output
from harness.node_agent import pump_until
from jobs.models import JobAttempt, JobEvent, JobExclusion, Node
from jobs.services.actions import request_stop
from jobs.statuses import JobStatus
from logs.models import LogLine

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SLEEPER = "python -c \"import time; print('Starting dataset initialization', flush=True); time.sleep(600)\""
CKPT_TRAINING = "python -m jobs.examples.train_ckpt --steps 400 --save-every 10 --sleep 0.02"
COMMIT = re.compile(r"\[Concurrent Checkpoint\] committed step=(\d+)")


def flow(job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).status_changes().order_by("id").values_list("to_status", flat=True))


def texts(job) -> list[str]:
    return job_output(job, stream="master")


class Rounds:
    """``embedded_round`` of one agent, called one at a time; ``run_until`` runs the agent on the
    console's schedule instead (``pump_until``)."""

    def __init__(self, agent) -> None:
        self.agent = agent

    def __call__(self) -> None:
        from agent.loop import embedded_round

        embedded_round(self.agent)


@pytest.fixture
def round_(agent):
    return Rounds(agent)


def run_until(round_: Rounds, condition, timeout: float = 60.0, what: str = "condition"):
    pump_until(round_.agent, condition, what, timeout=timeout)


def node_of(job, number: int = 1) -> Node:
    return JobAttempt.objects.get(job=job, number=number).placements.get().node


def started(job, round_, count: int = 1) -> None:
    run_until(round_, lambda: LogLine.objects.filter(job=job, text="Starting dataset initialization").count() >= count, what="start-up line")


def test_a_gpu_fault_fails_over_to_a_healthy_node_and_resumes_from_the_checkpoint(make_job, drive, round_):
    job = drive(make_job(command=CKPT_TRAINING, gpus_per_node=2), JobStatus.RUNNING)
    run_until(round_, lambda: any(COMMIT.search(t) for t in texts(job)), timeout=90, what="a committed checkpoint")
    first = node_of(job)
    inject_fault(first, gpu=0, xid=79, actor="test")
    job = drive(job, JobStatus.COMPLETED, timeout=180)

    assert flow(job) == ["Pending", "Running", "Pending - failoverinprogress", "Running", "Completed"]
    assert job.failover_count == 1
    second = node_of(job, 2)
    assert second != first
    assert JobExclusion.objects.filter(job=job, node=first).exists()
    # Xid 79 is GPU 0's fault: it leaves placement; the node's other GPUs stay placeable for others.
    first.refresh_from_db()
    assert first.healthy
    assert list(first.gpus.filter(healthy=False).values_list("index", flat=True)) == [0]
    assert "79" in first.gpus.get(index=0).health_reason

    resumed = JobAttempt.objects.get(job=job, number=2)
    assert resumed.resume_step is not None and resumed.resume_step >= 10
    lines = texts(job)
    assert lines.count("Starting dataset initialization") == 2
    assert f"Resumed from checkpoint step {resumed.resume_step}" in lines
    # Training continues from the checkpointed step, not from 0.
    after = lines[lines.index(f"Resumed from checkpoint step {resumed.resume_step}") + 1]
    assert after.startswith(f"step {resumed.resume_step + 1}/400")
    running = JobEvent.objects.filter(job=job, to_status="Running").order_by("id").last()
    assert running.reason.startswith(f"attempt 2 on {second.name}")
    assert "after a GPU fault: " in running.reason and first.name in running.reason and "79" in running.reason
    decision = JobAttempt.objects.get(job=job, number=1)
    assert decision.verdict == "hardware" and decision.evidence.get("xid") == 79


def test_a_user_code_error_is_refused_as_internal_error(make_job, drive):
    job = make_job(command='python -c "import no_such_module_for_sure"')
    job = drive(job, JobStatus.INTERNAL_ERROR)
    assert flow(job) == ["Pending", "Running", "Pending - failoverinprogress", "Pending - internalerror"]
    assert "ModuleNotFoundError" in job.status_reason
    assert job.failover_count == 0
    node = node_of(job)
    node.refresh_from_db()
    assert node.healthy
    event = JobEvent.objects.get(job=job, to_status="Pending - internalerror")
    assert event.evidence


def test_the_fourth_hardware_fault_exceeds_the_limit(make_job, drive, round_, settings, agent):
    from agent.inventory import register_nodes, simulated_nodes

    # Four nodes, so each of the four faults can move the job to a node it never ran on.
    settings.SIMULATED_NODES = 4
    register_nodes(simulated_nodes(), agent="embedded")
    agent.node_names.append("node-d")
    job = drive(make_job(command=SLEEPER, gpus_per_node=1), JobStatus.RUNNING)
    for number in range(1, 5):
        started(job, round_, count=number)
        inject_fault(node_of(job, number), gpu=0, kind="ecc")
        if number < 4:
            run_until(round_, lambda n=number: JobAttempt.objects.filter(job=job, number=n + 1, state="running").exists(), what=f"attempt {number + 1}")
    job = drive(job, JobStatus.MAX_RETRIES_EXCEEDED)
    assert job.failover_count == 3
    assert [node_of(job, n).name for n in range(1, 5)] == ["node-a", "node-b", "node-c", "node-d"]
    assert flow(job)[-2:] == ["Pending - failoverinprogress", "Pending - maxretriesexceeded"]
    assert "failover limit (3) spent" in job.status_reason


def test_with_failover_off_a_hardware_fault_ends_failed_saying_the_fault_and_resumes_from_its_checkpoint(make_job, drive, round_):
    """The reason names the fault, not the kill it caused; the user may Resume the Failed job
    from its last committed checkpoint (on another GPU: the faulty one is out of placement)."""
    from agent.resume import resumable_step
    from jobs.services.actions import resume_job

    job = drive(make_job(command=CKPT_TRAINING, failover_enabled=False), JobStatus.RUNNING)
    run_until(round_, lambda: any(COMMIT.search(t) for t in texts(job)), timeout=90, what="a committed checkpoint")
    inject_fault(node_of(job), gpu=0, xid=79)
    job = drive(job, JobStatus.FAILED)
    assert flow(job) == ["Pending", "Running", "Failed"]
    assert job.status_reason == "Xid 79 on GPU 0: GPU has fallen off the bus; Job Failover is off"
    step = resumable_step(job)
    assert step is not None and step >= 10
    resume_job(job, actor="owner", checkpoint_step=step)
    job = drive(job, JobStatus.COMPLETED, timeout=180)
    assert flow(job) == ["Pending", "Running", "Failed", "Pending", "Running", "Completed"]
    assert JobAttempt.objects.get(job=job, number=2).resume_step == step


def test_a_stop_during_failover_ends_stopped_and_never_fails_over(make_job, drive, round_, owner):
    # All other nodes are cordoned: the failover waits for capacity, and the user stops it.
    job = drive(make_job(command=SLEEPER), JobStatus.RUNNING)
    started(job, round_)
    Node.objects.exclude(pk=node_of(job).pk).update(cordoned=True)
    inject_fault(node_of(job), gpu=0, xid=79)
    job = drive(job, JobStatus.FAILOVER_IN_PROGRESS)
    run_until(round_, lambda: JobAttempt.objects.get(job=job, number=1).verdict == "hardware", what="verdict")
    assert request_stop(job, actor="owner") == JobStatus.STOPPED
    for _ in range(5):
        round_()
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED
    assert JobAttempt.objects.filter(job=job).count() == 1


def test_a_user_stop_is_never_failed_over(make_job, drive, round_):
    job = drive(make_job(command=SLEEPER), JobStatus.RUNNING)
    started(job, round_)
    request_stop(job, actor="owner")
    job = drive(job, JobStatus.STOPPED)
    assert "Pending - failoverinprogress" not in flow(job)


def test_a_node_lost_by_heartbeat_fails_its_job_over(make_job, drive, round_, nodes, settings, agent):
    from agent.node_agent import NodeAgent

    settings.NODE_HEARTBEAT_TIMEOUT = 2.0
    job = drive(make_job(command=SLEEPER), JobStatus.RUNNING)
    started(job, round_)
    lost = node_of(job)
    # From now on the agent serves the other nodes only: the lost node's agent went silent.
    survivors = NodeAgent([n.name for n in nodes if n.pk != lost.pk])
    agent.node_names.remove(lost.name)  # this process no longer serves it, so its sweep may take it as lost
    gc.collect()  # nor does an agent left over from an earlier test
    Node.objects.filter(pk=lost.pk).update(last_heartbeat=timezone.now() - timedelta(seconds=5))
    pump_until(survivors, lambda: JobAttempt.objects.filter(job=job, number=2, state="running").exists(), "attempt 2 running", timeout=60)
    job.refresh_from_db()
    lost.refresh_from_db()
    assert lost.state == Node.State.NOT_READY
    assert node_of(job, 2) != lost
    assert job.failover_count == 1
    first = JobAttempt.objects.get(job=job, number=1)
    assert first.verdict == "hardware" and "lost" in first.verdict_reason
    request_stop(job, actor="owner")

    def stopped() -> bool:
        job.refresh_from_db()
        return job.status == JobStatus.STOPPED

    pump_until(survivors, stopped, "the job stopped", timeout=30)


def test_a_spot_reclaim_sends_the_job_back_to_pending_and_it_resumes_elsewhere(make_job, drive, round_):
    job = drive(make_job(command=CKPT_TRAINING, job_type="Spot"), JobStatus.RUNNING)
    run_until(round_, lambda: any(COMMIT.search(t) for t in texts(job)), timeout=90, what="a committed checkpoint")
    node = node_of(job)
    assert reclaim_spot(node) == [job.pk]
    run_until(round_, lambda: JobAttempt.objects.filter(job=job, number=2, state="running").exists(), timeout=60, what="attempt 2")
    job.refresh_from_db()
    assert flow(job)[:4] == ["Pending", "Running", "Pending", "Running"]
    assert JobEvent.objects.filter(job=job, to_status="Pending", reason__startswith="spot capacity reclaimed").exists()
    assert job.failover_count == 0
    assert node_of(job, 2) != node
    second = JobAttempt.objects.get(job=job, number=2)
    # SIGTERM let ckptlib take a final checkpoint: the run resumes from it.
    assert second.resume_step is not None and second.resume_step > 0
    request_stop(job, actor="owner")
    drive(job, JobStatus.STOPPED)


def test_the_inject_fault_command_refuses_bad_input_clearly(nodes):
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="No node named 'nope'"):
        call_command("inject_fault", "nope")
    with pytest.raises(CommandError, match="has no GPU 9"):
        call_command("inject_fault", "node-a", "--gpu", "9")
    with pytest.raises(CommandError, match="Xid numbers run from 1 to 1000"):
        call_command("inject_fault", "node-a", "--xid", "5000")


def test_with_gpu_exclusion_a_job_moves_to_the_same_machines_healthy_gpus(make_job, drive, round_, settings):
    from jobs.models import GPU

    settings.FAILOVER_EXCLUDE = "gpu"
    Node.objects.exclude(name="node-a").update(cordoned=True)  # a single machine
    job = drive(make_job(command=SLEEPER), JobStatus.RUNNING)
    started(job, round_)
    inject_fault(node_of(job), gpu=0, xid=79)
    run_until(round_, lambda: JobAttempt.objects.filter(job=job, number=2, state="running").exists(), what="attempt 2")
    second = JobAttempt.objects.get(job=job, number=2).placements.get()
    assert (second.node.name, second.gpu_indices) == ("node-a", [1])
    assert Node.objects.get(name="node-a").healthy
    assert not GPU.objects.get(node__name="node-a", index=0).healthy
    assert JobExclusion.objects.filter(job=job, node__name="node-a", gpu=0).exists()
    request_stop(job, actor="owner")
    drive(job, JobStatus.STOPPED)
