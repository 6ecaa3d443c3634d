"""What a run was given does not outlive it: its container (Podman's record of its environment,
its writable layer), its secrets and its network are gone when it ends, a stopped and deleted job
leaves nothing in the container engine, and after many jobs the engine lists only running runs.
/tmp lives in memory and counts against the run's memory limit.

Real jobs on the embedded agent, in their containers (``RUNS_LATER``: how many jobs the last test
runs, 100 by default, as the issue measured).
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from agent import cgroups, runfiles
from agent.launch import container_prefix, engine_env, sweep_strays
from agent.loop import embedded_round
from agent.processes import run_dir, signal_run
from harness.node_agent import pump_until
from harness.sandbox import needs_sandbox
from jobs.models import JobAttempt, TrainingJob
from jobs.services.actions import delete_job, request_stop
from jobs.statuses import TERMINAL, JobStatus
from logs.models import LogLine

pytestmark = [pytest.mark.django_db, pytest.mark.slow, needs_sandbox]
REPO = Path(__file__).resolve().parents[2]
TOOL_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def engine(*argv: str) -> list[str]:
    """What ``podman <argv>`` prints in the console's container engine, a word a line."""
    listed = subprocess.run(["podman", *argv], env={**engine_env(), **TOOL_ENV}, capture_output=True, text=True, check=True)
    return listed.stdout.split()


def containers_of(job: TrainingJob) -> list[str]:
    """The names every run of ``job`` gave its container (from the runs' specs)."""
    names = []
    for attempt in JobAttempt.objects.filter(job=job):
        for part in attempt.placements.all():
            policy = runfiles.spec_container(run_dir(part)) or {}
            names.append(str(policy.get("name")))
    return names


def test_nothing_of_a_finished_run_is_left_on_the_node(make_job, drive, settings):
    """Its container, its network and its secret: a grep of the secret's value over var/ (the
    console's data and the container engine's storage), the runs' records and the node's /run
    finds nothing."""
    secret = "hf_LEFT_BEHIND_" + str(time.time_ns())
    digest = hashlib.sha256(secret.encode()).hexdigest()
    check = f'test "$(printf %s "$HF_TOKEN" | sha256sum | cut -d" " -f1)" = {digest} && echo got-the-secret'
    job = drive(make_job(command=check, env={"HF_TOKEN": secret}, gpus_per_node=0), JobStatus.COMPLETED)
    assert LogLine.objects.filter(job=job, text="got-the-secret").exists()
    roots = [str(p) for p in (REPO / "var", Path(settings.JOB_WORK_ROOT), Path("/run/satrain")) if p.exists()]
    found = subprocess.run(["grep", "-rlaF", secret, *roots], check=False, capture_output=True, text=True)
    assert found.stdout == ""
    names = containers_of(job)
    assert names and all(n.startswith(container_prefix()) for n in names)
    assert not set(names) & set(engine("ps", "-a", "--format", "{{.Names}}"))
    network = (runfiles.spec_container(run_dir(JobAttempt.objects.get(job=job).placements.get())) or {})["job_network"]["name"]
    assert network not in engine("network", "ls", "--format", "{{.Name}}")


def test_a_stopped_and_deleted_job_leaves_no_container_and_no_layer(make_job, drive, agent):
    """The issue's job wrote 1 GiB into its image's filesystem and left 1.1 GiB after Delete."""
    fill = "dd if=/dev/zero of=/var/tmp/fill bs=1M count=200 status=none && echo filled && sleep 300"
    job = make_job(command=fill, gpus_per_node=0)
    pump_until(agent, LogLine.objects.filter(job=job, text="filled").exists, "the job filled its layer", timeout=60)
    name = containers_of(job)[0]
    upper = engine("container", "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", name)[0]
    assert (Path(upper) / "var/tmp/fill").stat().st_size == 200 << 20
    request_stop(job, actor="owner")
    job = drive(job, JobStatus.STOPPED, timeout=60)
    delete_job(job)
    assert name not in engine("ps", "-a", "--format", "{{.Names}}")
    assert not Path(upper).exists()


def test_a_run_killed_with_its_containers_monitor_leaves_no_container(make_job, drive, agent):
    """A SIGKILL to the whole run (a stop's grace spent, a fatal GPU event) kills Podman's monitor
    in the run's cgroup too; Podman refuses the first removal of such a container, not the second."""
    job = make_job(command="echo up && sleep 300", gpus_per_node=0, failover_enabled=False)
    drive_one_running(job, agent)
    part = JobAttempt.objects.get(job=job).placements.get()
    assert signal_run(part, signal.SIGKILL)
    job = drive(job, {JobStatus.FAILED, JobStatus.COMPLETED}, timeout=60)
    assert containers_of(job)[0] not in engine("ps", "-a", "--format", "{{.Names}}")


def test_many_jobs_later_the_engine_lists_only_running_runs(make_job, agent, settings):
    """Completed, failed, stopped and killed runs alike: the engine keeps none of their containers."""
    sweep_strays(set())  # as an agent's start does: what the suite's killed runs left before this test
    assert not [n for n in engine("ps", "-a", "--format", "{{.Names}}") if n.startswith(container_prefix())]
    count = int(os.environ.get("RUNS_LATER", "100"))
    settings.QUEUE_CPU_JOBS_PER_PROJECT = 12
    settings.QUEUE_MAX_WAITING_PER_USER = count + 10
    commands = ["true", "exit 3", "sleep 300", "kill -9 $$"]
    jobs = [make_job(name=f"many-{i}", command=commands[i % len(commands)], gpus_per_node=0, failover_enabled=False) for i in range(count)]
    started = time.monotonic()
    while True:
        embedded_round(agent)
        for job in TrainingJob.objects.filter(pk__in=[j.pk for j in jobs], status=JobStatus.RUNNING, command="sleep 300"):
            request_stop(job, actor="owner")
        left = TrainingJob.objects.filter(pk__in=[j.pk for j in jobs]).exclude(status__in=TERMINAL).count()
        if not left:
            break
        assert time.monotonic() - started < 60 + 3 * count, f"{left} of {count} jobs still going"
        time.sleep(0.1)
    keeper = drive_one_running(make_job(name="still-running", command="echo up && sleep 300", gpus_per_node=0), agent)
    ours = [n for n in engine("ps", "-a", "--format", "{{.Names}}") if n.startswith(container_prefix())]
    assert ours == containers_of(keeper)
    assert engine("container", "inspect", "--format", "{{.State.Status}}", ours[0]) == ["running"]


def drive_one_running(job: TrainingJob, agent) -> TrainingJob:
    pump_until(agent, LogLine.objects.filter(job=job, text="up").exists, "the job started", timeout=60)
    return job


@pytest.mark.skipif(not cgroups.support()[0], reason=f"this machine cannot enforce job limits: {cgroups.support()[1]}")
def test_tmp_counts_against_the_memory_limit(make_job, drive):
    """/tmp is a tmpfs of the run's: what a job writes there is memory, charged to its limit."""
    fill = "dd if=/dev/zero of=/tmp/fill bs=1M count=400 status=none; echo dd-exit=$?"
    job = drive(make_job(command=fill, memory_limit_mb=128, gpus_per_node=0), {JobStatus.FAILED, JobStatus.COMPLETED}, timeout=60)
    lines = list(LogLine.objects.filter(job=job).values_list("text", flat=True))
    assert "dd-exit=0" not in lines, (job.status, job.status_reason, lines[-5:])
    assert job.status == JobStatus.FAILED and "out of memory" in job.status_reason
