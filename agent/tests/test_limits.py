"""CPU and memory limits: each run in a cgroup of its own, where the node allows one.

Real jobs on the embedded agent, in the sandbox; the tests need a node that can enforce limits
(root with a writable cgroup hierarchy) and skip elsewhere, saying why.
"""

from __future__ import annotations

import shlex
import time
from pathlib import Path

import psutil
import pytest

from agent import cgroups, runfiles
from agent.processes import run_dir
from harness.job_factory import job_output
from jobs.models import AttemptNode, JobAttempt, Node
from jobs.services.paths import default_output_dir
from jobs.statuses import JobStatus

ENFORCED, WHY = cgroups.support()
needs_cgroups = pytest.mark.skipif(not ENFORCED, reason=f"this machine cannot enforce job limits: {WHY}")

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

# Four processes burn the CPU for a few seconds of wall time (enough to reach the quota on a
# busy machine); the parent prints the CPU time they got per second of wall time (cores used).
BURN = """
import os, time
start = time.time()
children = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        while time.time() - start < 3.0:
            pass
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
wall = time.time() - start
used = os.times().children_user + os.times().children_system
print(f"cores {used / wall:.3f}", flush=True)
"""


def lines_of(job) -> list[str]:
    return job_output(job)


@needs_cgroups
def test_the_nodes_say_they_enforce_limits(nodes):
    for node in Node.objects.all():
        assert node.limits_enforced, node.limits_note
        assert node.limits_note.startswith("cgroup v")
        assert node.cpu_count >= 1 and node.memory_mb >= 256


@needs_cgroups
def test_a_job_over_its_memory_limit_is_killed_and_the_reason_says_out_of_memory(make_job, drive):
    grab = "python -c " + shlex.quote("print('allocating', flush=True)\nb = b'x' * (400 << 20)\nprint('survived', flush=True)")
    job = drive(make_job(command=grab, memory_limit_mb=96), {JobStatus.FAILED, JobStatus.COMPLETED, JobStatus.INTERNAL_ERROR}, timeout=60)
    assert job.status == JobStatus.FAILED, job.status_reason
    assert "out of memory" in job.status_reason and "memory limit of 96 MiB" in job.status_reason
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.cause.startswith("out of memory") and attempt.exit_signal == 9
    assert lines_of(job) == ["allocating"]


@needs_cgroups
def test_a_job_within_its_memory_limit_runs_to_the_end(make_job, drive):
    job = make_job(command="python -c " + shlex.quote("b = b'x' * (50 << 20); print('done', flush=True)"), memory_limit_mb=256)
    job = drive(job, {JobStatus.COMPLETED, JobStatus.FAILED}, timeout=60)
    assert job.status == JobStatus.COMPLETED, job.status_reason
    assert lines_of(job) == ["done"]


@needs_cgroups
def test_a_job_with_half_a_cpu_gets_about_half_a_core(make_job, drive):
    job = drive(make_job(command="python -c " + shlex.quote(BURN), cpu_limit=0.5), JobStatus.RUNNING, timeout=60)
    part = AttemptNode.objects.select_related("attempt").get(attempt__job=job)
    for _ in range(100):  # the runner records its process group and cgroup as it starts
        if runfiles.pid_written(run_dir(part)):
            break
        time.sleep(0.05)
    cpu_dir = next(Path(d) for d in runfiles.read_pid(run_dir(part)).cgroup if "/cpu" in d)
    quota = (
        (cpu_dir / "cpu.max").read_text().split()
        if (cpu_dir / "cpu.max").exists()
        else [(cpu_dir / "cpu.cfs_quota_us").read_text().strip(), (cpu_dir / "cpu.cfs_period_us").read_text().strip()]
    )
    assert int(quota[0]) / int(quota[1]) == 0.5
    throttled = 0
    while not throttled and not runfiles.exit_written(run_dir(part)):
        # The kernel's own count of periods in which the run spent its quota.
        try:
            stat = dict(line.split() for line in (cpu_dir / "cpu.stat").read_text().splitlines())
        except OSError:
            break  # the run ended and its cgroup went with it
        throttled = int(stat.get("nr_throttled", 0))
        time.sleep(0.05)
    job = drive(job, {JobStatus.COMPLETED, JobStatus.FAILED}, timeout=60)
    assert job.status == JobStatus.COMPLETED, job.status_reason
    cores = float(lines_of(job)[-1].split()[1])
    # Four busy processes would use every core; the quota holds them to half of one (loose
    # bounds: the machine is shared). The kernel throttled the run whenever it reached its
    # quota; only a machine too busy to give it even that much leaves it unthrottled.
    assert 0.05 < cores < 0.7, cores
    assert throttled > 0 or cores < 0.45, (throttled, cores)


@needs_cgroups
def test_a_runs_cgroup_is_removed_when_it_ends(make_job, drive):
    job = drive(make_job(command="python -c 'print(1)'", cpu_limit=1, memory_limit_mb=128), JobStatus.COMPLETED, timeout=60)
    part = AttemptNode.objects.select_related("attempt").get(attempt__job=job)
    made = runfiles.read_pid(run_dir(part)).cgroup
    assert made and all(cgroups.RUN_NAME.match(Path(d).name) for d in made)
    assert not any(Path(d).exists() for d in made)


def test_where_the_node_cannot_enforce_limits_the_job_still_runs_and_its_log_says_so(make_job, drive, settings, agent):
    import uuid

    # A parent that does not exist (a fresh name: Podman makes the parents it is given).
    settings.JOB_CGROUP_PARENT = f"/no-such-parent-{uuid.uuid4().hex[:12]}/for-this-test"
    job = make_job(command="python -c 'print(\"ran\")'", memory_limit_mb=128)
    job = drive(job, {JobStatus.COMPLETED, JobStatus.FAILED}, timeout=60)
    assert job.status == JobStatus.COMPLETED, job.status_reason
    first, *rest = lines_of(job)
    assert first.startswith("[console] the job's CPU and memory limits are not enforced on this node: ")
    assert rest == ["ran"]


ESCAPE = """
import os, time
path = os.path.join(os.environ["OUTPUT_DIR"], "daemon.pid")
if os.fork() == 0:
    os.setsid()
    if os.fork():
        os._exit(0)
    null = os.open(os.devnull, os.O_RDWR)  # a proper daemon: off the run's output too
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    open(path + ".tmp", "w").write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    time.sleep(300)
    os._exit(0)
while not os.path.exists(path):
    time.sleep(0.05)
print("daemon started", flush=True)
"""


@needs_cgroups
def test_a_process_that_left_its_run_ends_with_the_run_even_without_the_sandbox(make_job, drive, settings):
    # Without the sandbox's PID namespace, a double-forked daemon leaves the run's session and
    # process tree; its cgroup still holds it, and the runner ends it with the run.
    settings.JOB_SANDBOX = "off"
    job = drive(make_job(command="python -c " + shlex.quote(ESCAPE)), {JobStatus.COMPLETED, JobStatus.FAILED}, timeout=60)
    assert job.status == JobStatus.COMPLETED, job.status_reason
    daemon = int((default_output_dir(job.pk) / "daemon.pid").read_text())
    for _ in range(40):
        if not psutil.pid_exists(daemon) or psutil.Process(daemon).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.05)
    else:
        psutil.Process(daemon).kill()
        raise AssertionError(f"the run's daemon {daemon} outlived it")
