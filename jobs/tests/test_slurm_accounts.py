"""Projects as Slurm accounts, on a real cluster that keeps accounts (MariaDB, slurmdbd, limits
enforced): a project's job runs under its account, whose ``GrpTRES=gres/gpu`` is the project's
quota plus borrow limit; work beyond it waits in Slurm with Slurm's reason shown on the job; the
account follows a quota changed in the console."""

from __future__ import annotations

import pytest

from console.testing import needs_sandbox
from failover.tests.test_failover_on_slurm import running_attempt, wait_until
from jobs.backends.slurm.client import Submission
from jobs.models import Project
from jobs.statuses import JobStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, needs_sandbox, pytest.mark.usefixtures("no_run_outlives_its_test")]


@pytest.fixture
def accounted(slurm_accounting_cluster, settings):
    settings.BACKEND = "slurm"
    settings.SLURM_CONF = str(slurm_accounting_cluster.conf)
    settings.SLURM_HEALTH_DIR = str(slurm_accounting_cluster.health_dir)
    settings.SLURM_SPOT_PARTITION = "spot"
    settings.SLURM_POLL_INTERVAL = 0.3
    settings.SLURM_ACCOUNTS = "auto"
    yield slurm_accounting_cluster
    from jobs.tests.slurm_fixtures import reset

    reset(slurm_accounting_cluster)


@pytest.fixture
def nodes(db, accounted, settings):
    from agent.inventory import register_nodes
    from agent.slurm import slurm_backend, slurm_nodes

    settings.SIMULATED_GPUS = "1"
    return register_nodes(slurm_nodes(slurm_backend().nodes()), agent="slurm")


@pytest.fixture
def agent(nodes, settings):
    from agent.slurm import SlurmAgent

    settings.STOP_GRACE_PERIOD = 5.0
    return SlurmAgent([n.name for n in nodes])


@pytest.fixture
def team(owner):
    project = Project.objects.create(name="team", gpu_quota=1, gpu_borrow_limit=1)
    project.members.add(owner)
    return project


def test_a_projects_job_runs_under_its_account_whose_gpu_limit_slurm_enforces(make_job, drive, agent, accounted, team):
    client = accounted.client
    # The project's account exists already (an operator made it, with a looser limit), and
    # someone outside the console runs on it with 2 GPUs.
    client.set_account("satrain-team", gpu_limit=3, user="root")
    other = client.submit(Submission(
        name="outside", script="#!/bin/bash\nsleep 6\n", output="/dev/null", workdir="/tmp", gpus_per_node=2, account="satrain-team",
    ))  # fmt: skip
    job = make_job(command="echo on $SLURM_JOB_ACCOUNT; exit 0", gpus_per_node=1, project=team)
    # The console sets the account's limit to the project's quota plus borrow limit (2): Slurm
    # holds the job beyond it, and the job says why in Slurm's words and ours.
    wait_until(agent, lambda: "AssocGrpGRES" in (job.refresh_from_db() or job.status_reason), "Slurm's limit shown on the job", timeout=60)
    assert job.status == JobStatus.PENDING and "GPU limit" in job.status_reason, job.status_reason
    account = client.accounts()["satrain-team"]
    assert account.gpu_limit == 2 and "root" in account.users, account
    part = running_attempt(job, 1)
    record = client.job(int(part.backend_job))
    assert record is not None and record.record.get("Account") == "satrain-team" and record.reason == "AssocGrpGRES", record.record
    # Once the outside job ends, the account has room: the job runs and completes under it.
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    assert client.job(other) is None or client.job(other).state == "COMPLETED"
    from console.testing import job_output

    assert job_output(job) == ["on satrain-team"], job_output(job)


def test_the_console_creates_the_account_and_it_follows_the_projects_quota(make_job, drive, agent, accounted, owner):
    lab = Project.objects.create(name="lab", gpu_quota=2, gpu_borrow_limit=0)
    lab.members.add(owner)
    assert "satrain-lab" not in accounted.client.accounts()
    job = drive(make_job(command="exit 0", gpus_per_node=1, project=lab), JobStatus.COMPLETED, timeout=120)
    assert job.failover_count == 0
    assert accounted.client.accounts()["satrain-lab"].gpu_limit == 2
    Project.objects.filter(pk=lab.pk).update(gpu_quota=3, gpu_borrow_limit=1)
    wait_until(agent, lambda: accounted.client.accounts()["satrain-lab"].gpu_limit == 4, "GrpTRES gres/gpu=4", timeout=30)
    Project.objects.filter(pk=lab.pk).update(gpu_borrow_limit=None)  # borrows without limit: no GPU limit in Slurm
    wait_until(agent, lambda: accounted.client.accounts()["satrain-lab"].gpu_limit is None, "no GPU limit", timeout=30)
    # Accounts without the prefix are the cluster's own: never touched.
    assert accounted.client.accounts()["root"].gpu_limit is None
