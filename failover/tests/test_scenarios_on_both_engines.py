"""The same scenarios against both engines, through the one interface the control plane speaks to
(``jobs.backends.base.Backend``): the console's own node agents (``agent.node_agent.NodeAgent`` on
three simulated nodes) and a Slurm cluster (``agent.slurm.SlurmEngine`` on three ``slurmd`` with
fake GPUs). Each scenario is written once and asserts what a user sees, whichever engine ran it:
a run to its end, a user error refused without condemning a node, an Xid 79 failed over to
another node with the faulty one excluded, a max run time that ends the job and says so."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from agent.inventory import register_nodes, simulated_nodes
from agent.node_agent import NodeAgent
from failover.services.faults import inject_fault
from failover.tests.test_failover_on_slurm import wait_until
from harness.job_factory import job_output
from harness.sandbox import needs_sandbox
from jobs.models import AttemptNode, JobAttempt, Node, TrainingJob
from jobs.statuses import JobStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, needs_sandbox, pytest.mark.usefixtures("no_run_outlives_its_test")]

SLEEPER = "python -c \"import os, time; print('started attempt', os.environ['JOB_ATTEMPT'], flush=True); time.sleep(600)\""


@pytest.fixture(params=["agents", "slurm"])
def nodes(request, db, settings):
    """The engine's three nodes of four GPUs, registered as the console registers them."""
    settings.STOP_GRACE_PERIOD = 5.0
    if request.param == "agents":
        settings.SIMULATED_NODES = 3
        settings.SIMULATED_GPUS_PER_NODE = 4
        return register_nodes(simulated_nodes(), agent="embedded")
    from agent.slurm import slurm_nodes, slurm_scheduler

    request.getfixturevalue("slurm")  # the console on the session's Slurm cluster (BACKEND=slurm)
    settings.SIMULATED_GPUS = "1"  # faults can be injected on its fake GPUs
    return register_nodes(slurm_nodes(slurm_scheduler().nodes()), agent="slurm")


@pytest.fixture
def agent(nodes):
    """The engine under test, as ``agent.backend`` would start it for the nodes' backend."""
    from agent.slurm import SlurmEngine

    names = [node.name for node in nodes]
    return SlurmEngine(names) if nodes[0].agent == "slurm" else NodeAgent(names)


def test_a_run_ends_completed_with_its_output(make_job, drive):
    job = drive(make_job(command="echo hello; echo world", gpus_per_node=2), JobStatus.COMPLETED, timeout=120)
    assert job.status_reason == "exit code 0"
    assert job_output(job) == ["hello", "world"]
    part = AttemptNode.objects.get(attempt__job=job)
    assert len(part.gpu_indices) == 2 and part.ended_at is not None


def test_a_user_error_is_refused_without_condemning_a_node(make_job, drive):
    job = drive(make_job(command="echo starting; python -c 'import no_such_module'"), JobStatus.INTERNAL_ERROR, timeout=120)
    assert "ModuleNotFoundError" in job.status_reason and job.failover_count == 0, job.status_reason
    assert not Node.objects.filter(healthy=False).exists() and not job.exclusions.exists()


def test_an_xid_79_mid_run_fails_over_to_another_node_never_the_faulty_one(make_job, drive, agent):
    job = drive(make_job(command=SLEEPER), JobStatus.RUNNING, timeout=120)
    wait_until(agent, lambda: "started attempt 1" in job_output(job), "attempt 1's first line")
    first = AttemptNode.objects.select_related("node").get(attempt__job=job, attempt__number=1)
    inject_fault(first.node, gpu=first.gpu_indices[0], xid=79, actor="test")
    wait_until(agent, lambda: JobAttempt.objects.filter(job=job, number=2, state="running").exists(), "attempt 2 running", timeout=120)
    second = AttemptNode.objects.select_related("node").get(attempt__job=job, attempt__number=2)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.failover_count == 1, (job.status, job.status_reason)
    assert second.node != first.node and job.exclusions.filter(node=first.node).exists()
    wait_until(agent, lambda: "started attempt 2" in job_output(job), "attempt 2's first line")
    # One log, both attempts (and, where replicas were looked at, the platform's line saying what attempt 2 continues from).
    assert [line for line in job_output(job) if not line.startswith("[satrain] ")] == ["started attempt 1", "started attempt 2"], job_output(job)


def test_a_max_run_time_ends_the_job_and_says_so(make_job, drive):
    job = drive(make_job(command=SLEEPER, max_run_minutes=1), JobStatus.RUNNING, timeout=120)
    TrainingJob.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=2))
    job = drive(job, JobStatus.STOPPED, timeout=60)
    assert job.status_reason.startswith("max run time of 1 min exceeded"), job.status_reason
