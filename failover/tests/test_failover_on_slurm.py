"""The console on a real Slurm cluster (``BACKEND=slurm``, three slurmd on this host with fake
GPUs): each rank a Slurm batch job, and the same scenarios as on the agents — a run to its end,
the guide's Spot script failed over on an Xid 79 with its node drained in Slurm, a user error
refused without a drain, the failover limit, a Spot run preempted by On-Demand work, slurmd
killed under a run; and, on a cluster that keeps accounts, each project a Slurm account with its
GPU limit."""

from __future__ import annotations

import pwd
import shlex
import signal
import subprocess
import time

import pytest

import ckptlib
from failover.services.faults import clear_node, inject_fault
from failover.tests.test_spot_script_in_a_container import fault_after_first_commit
from harness.job_factory import job_output
from harness.node_agent import pump_until
from harness.sandbox import needs_sandbox
from jobs.models import AttemptNode, JobAttempt, Node, Project
from jobs.statuses import JobStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, needs_sandbox, pytest.mark.usefixtures("no_run_outlives_its_test")]


@pytest.fixture
def nodes(db, slurm, settings):
    """The cluster's nodes, registered from Slurm (simulated GPUs: faults can be injected)."""
    from agent.inventory import register_nodes
    from agent.slurm import slurm_nodes, slurm_scheduler

    settings.SIMULATED_GPUS = "1"
    return register_nodes(slurm_nodes(slurm_scheduler().nodes()), agent="slurm")


@pytest.fixture
def agent(nodes, settings):
    from agent.slurm import SlurmEngine

    settings.STOP_GRACE_PERIOD = 5.0
    return SlurmEngine([n.name for n in nodes])


def slurm_node(slurm, name: str):
    return next(node for node in slurm.client.nodes() if node.name == name)


def ready_line_count(job) -> int:
    return sum(1 for line in job.log_lines.values_list("text", flat=True) if "environment ready: starting the command" in line)


def test_a_job_runs_as_a_slurm_batch_job_to_its_end(make_job, drive, slurm):
    job = make_job(command="echo hello from $SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES; exit 0", gpus_per_node=2)
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    part = AttemptNode.objects.get(attempt__job=job)
    assert part.backend_job, "the rank was not a Slurm job"
    record = slurm.client.job(int(part.backend_job))
    assert record is not None and record.state == "COMPLETED" and record.nodes == [part.node.name]
    assert record.record.get("TresPerNode", "").endswith("gpu:2"), record.record
    # Slurm's own names reach the run, as a batch script there sees them.
    assert job_output(job) == [f"hello from {part.node.name} gpus={','.join(map(str, part.gpu_indices))}"], job_output(job)


def test_on_a_site_cluster_a_run_is_the_service_accounts_inside_its_slurm_jobs_cgroup_with_only_its_gpus(make_job, drive, slurm):
    """The cluster is configured as GPU sites run Slurm, and the run lives inside what Slurm gave
    it: its container rootless, its user the service account, nested in the Slurm job's cgroup
    whose device list allows only the GPU allocated."""
    conf = slurm.conf.read_text()
    for line in ("ProctrackType=proctrack/cgroup", "TaskPlugin=task/cgroup", "DisableRootJobs=YES"):
        assert line in conf.splitlines(), line
    assert "ConstrainDevices=yes" in (slurm.conf.parent / "cgroup.conf").read_text().splitlines()
    opens = "import glob, os\nfor p in sorted(glob.glob('/dev/nvidia[0-9]*')):\n try: os.open(p, os.O_RDWR)\n except OSError as e: print(p, e.strerror)"
    job = make_job(command=f"id -u; grep -m1 ':devices:' /proc/self/cgroup; python3 -c {shlex.quote(opens)}", gpus_per_node=1)
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    part = AttemptNode.objects.get(attempt__job=job)
    account = pwd.getpwnam(slurm.user)
    record = slurm.client.job(int(part.backend_job))
    assert record is not None and record.record.get("UserId", "").startswith(f"{slurm.user}("), record.record
    uid, cgroup, *devices = job_output(job)
    assert uid == str(account.pw_uid), job_output(job)
    assert f"/slurm_{part.node.name}/uid_{account.pw_uid}/job_{part.backend_job}/" in cgroup, cgroup
    # Its one GPU is the node's GRES device, which the cgroup lets it open (no driver: ENXIO).
    assert devices == [f"/dev/nvidia{part.gpu_indices[0]} No such device or address"], job_output(job)


def test_the_spot_script_fails_over_on_xid_79_with_its_node_drained_in_slurm(make_job, drive, agent, slurm):
    job, part = fault_after_first_commit(make_job, drive, agent)
    assert job.status == JobStatus.COMPLETED, (job.status_reason, job_output(job)[-30:])
    assert job.failover_count == 1
    drained = slurm_node(slurm, part.node.name)
    assert "DRAIN" in drained.state and "Xid 79" in drained.reason, drained
    second = JobAttempt.objects.get(job=job, number=2)
    moved = second.placements.get()
    assert moved.node != part.node and moved.backend_job and moved.backend_job != part.backend_job
    assert second.resume_step is not None and second.resume_step >= 6 and second.resume_step % 6 == 0
    resumed = [line for line in job_output(job, attempt=2) if "resuming from" in line]
    assert resumed and resumed[0].endswith(f"/job/work/results/concurrent_checkpoint/checkpoint-{second.resume_step}"), resumed
    assert ready_line_count(job) == 2
    # Mark healthy returns the node to Slurm.
    clear_node(Node.objects.get(pk=part.node_id), actor="test")
    wait_until(agent, lambda: "DRAIN" not in slurm_node(slurm, part.node.name).state, "the node resumed in Slurm", timeout=30)


SLEEPER = "echo started attempt $JOB_ATTEMPT on $SLURMD_NODENAME; sleep 600"


def wait_until(agent, predicate, what: str, timeout: float = 120.0) -> None:
    pump_until(agent, predicate, what, timeout=timeout)


def running_attempt(job, number: int) -> AttemptNode:
    return AttemptNode.objects.select_related("node").get(attempt__job=job, attempt__number=number)


def test_a_user_error_is_refused_without_draining_a_node(make_job, drive, slurm):
    job = make_job(command="echo starting; python -c 'import no_such_module'", gpus_per_node=1)
    job = drive(job, JobStatus.INTERNAL_ERROR, timeout=120)
    assert "ModuleNotFoundError" in job.status_reason and job.failover_count == 0
    assert not any("DRAIN" in node.state for node in slurm.client.nodes()), slurm.client.nodes()


def test_three_hardware_faults_spend_the_failover_limit(make_job, drive, agent, slurm, settings):
    settings.MAX_FAILOVERS = 2  # three nodes: the third fault is the one past the limit
    job = drive(make_job(command=SLEEPER, gpus_per_node=1), JobStatus.RUNNING, timeout=120)
    for number in (1, 2, 3):
        wait_until(agent, lambda n=number: JobAttempt.objects.filter(job=job, number=n, state="running").exists(), f"attempt {number} running")
        part = running_attempt(job, number)
        inject_fault(part.node, gpu=part.gpu_indices[0], xid=79, actor="test")
        if number < 3:
            wait_until(agent, lambda n=number: JobAttempt.objects.filter(job=job, number=n + 1).exists(), f"attempt {number + 1}")
    job = drive(job, JobStatus.MAX_RETRIES_EXCEEDED, timeout=120)
    assert job.failover_count == 2
    assert [running_attempt(job, n).node.name for n in (1, 2, 3)] == ["node-a", "node-b", "node-c"]
    assert all("DRAIN" in node.state and "Xid 79" in node.reason for node in slurm.client.nodes()), slurm.client.nodes()


def test_the_spot_script_preempted_by_on_demand_work_waits_and_resumes_from_its_checkpoint_without_a_failover(make_job, drive, agent, slurm):
    """The guide's Spot script as a Spot job (Slurm's preemptible partition): another user's
    On-Demand job needs its node's GPUs, Slurm preempts it (SIGTERM, GraceTime), the job is
    Pending again, never a failover, and its next attempt resumes from the last checkpoint."""
    from harness.spot import ENV, SPOT
    from jobs.backends.slurm.client import Submission
    from jobs.models import TrainingJob

    job = make_job(command=SPOT, env=ENV, gpus_per_node=1, job_type=TrainingJob.JobType.SPOT)
    job = drive(job, JobStatus.RUNNING, timeout=120)
    first = running_attempt(job, 1)
    wait_until(agent, lambda: commits(job, 1), "attempt 1's first checkpoint", timeout=300)
    assert slurm.client.job(int(first.backend_job)).record.get("Partition") == "spot"
    slurm.client.submit(Submission(
        user=slurm.other_user,
        name="on-demand", script="#!/bin/bash\nsleep 20\n", output="/dev/null", workdir="/tmp", gpus_per_node=4,
        nodelist=(first.node.name,), partition="gpu",
    ))  # fmt: skip
    wait_until(agent, lambda: JobAttempt.objects.filter(job=job, number=2).exists(), "a second attempt", timeout=120)
    job.refresh_from_db()
    assert job.failover_count == 0
    reasons = list(job.events.values_list("reason", flat=True))
    assert any("preempted by Slurm" in r for r in reasons), reasons
    wait_until(agent, lambda: JobAttempt.objects.filter(job=job, number=2, state="running").exists(), "attempt 2 running", timeout=120)
    second = JobAttempt.objects.get(job=job, number=2)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and job.failover_count == 0
    assert second.placements.get().node != first.node  # the preempted node holds off Spot work
    assert second.resume_step is not None and second.resume_step >= max(commits(job, 1)), (second.resume_step, commits(job, 1))


def commits(job, attempt: int) -> list[int]:
    return [e.step for line in job_output(job, attempt=attempt) if (e := ckptlib.parse_commit_line(line))]


def test_slurmd_killed_under_a_run_fails_it_over(make_job, drive, agent, slurm):
    job = drive(make_job(command=SLEEPER, gpus_per_node=1), JobStatus.RUNNING, timeout=120)
    first = running_attempt(job, 1)
    wait_until(agent, lambda: any("started attempt 1" in line for line in job_output(job)), "the run's first line")
    slurm.kill_node(first.node.name)
    try:
        wait_until(agent, lambda: JobAttempt.objects.filter(job=job, number=2, state="running").exists(), "attempt 2 running", timeout=120)
        job.refresh_from_db()
        assert job.failover_count == 1
        assert running_attempt(job, 2).node != first.node
        reasons = list(job.events.values_list("reason", flat=True))
        assert any("Slurm has it DOWN" in r for r in reasons), reasons
    finally:
        slurm.start_node(first.node.name)


def test_an_xid_in_the_nodes_own_kernel_log_reaches_the_console_and_fails_the_run_over(make_job, drive, agent, slurm):
    """No fault injected into the console: the Xid is a line in the node's kernel log. Slurm's
    HealthCheckProgram on the node (``failover.nodecheck``) hands it over, the console's monitor
    stops the run and marks the GPU, the node is drained in Slurm, the job runs elsewhere."""
    from failover.kmsg import boot_time
    from failover.models import HealthEvent
    from failover.probes import simulated_bus

    job = drive(make_job(command=SLEEPER, gpus_per_node=1), JobStatus.RUNNING, timeout=120)
    first = running_attempt(job, 1)
    wait_until(agent, lambda: any("started attempt 1" in line for line in job_output(job)), "the run's first line")
    gpu = first.gpu_indices[0]
    text = f"NVRM: Xid (PCI:{simulated_bus(gpu)}): 79, pid=4242, name=python, GPU has fallen off the bus."
    usec = int((time.time() - boot_time()) * 1e6)
    with open(slurm.kernel_log(first.node.name), "a") as kmsg:
        kmsg.write(f"12,1,{usec},-;{text} (written by a process, not the kernel: ignored)\n3,2,{usec},-;{text}\n")
    wait_until(agent, lambda: JobAttempt.objects.filter(job=job, number=2, state="running").exists(), "attempt 2 running", timeout=90)
    job.refresh_from_db()
    assert job.failover_count == 1 and running_attempt(job, 2).node != first.node
    events = list(HealthEvent.objects.filter(node=first.node, source="kmsg").values_list("gpu", "xid", "message"))
    assert events == [(gpu, 79, text)], events
    # The kill went through Slurm to the runner, which killed the run and outlived it: the run's
    # exit is the runner's own record (its last lines passed on), as on the agents.
    from agent import runfiles
    from agent.processes import run_dir

    killed = JobAttempt.objects.get(job=job, number=1)
    assert killed.exit_signal == signal.SIGKILL and killed.cause == "killed by SIGKILL", (killed.exit_signal, killed.cause)
    record = runfiles.read_exit(run_dir(first))
    assert record is not None and record.signal == signal.SIGKILL
    wait_until(agent, lambda: "Xid 79" in slurm_node(slurm, first.node.name).reason, "the node drained in Slurm with the Xid", timeout=30)


def test_an_xid_the_node_handed_over_while_the_console_was_down_fails_the_run_over_when_it_is_back(make_job, drive, agent, slurm):
    """The console stops under a run; the node's kernel writes an Xid 79 and its own check hands
    it over and drains the node (the site's choice, as NHC does); the console started again reads
    what it missed (``EvidenceCursor``), once: the run is stopped, the job runs elsewhere."""
    from agent.slurm import SlurmEngine
    from failover.kmsg import boot_time
    from failover.models import EvidenceCursor, HealthEvent
    from failover.nodecheck import evidence_paths
    from failover.probes import simulated_bus

    slurm.drain_on_fault(True)
    job = drive(make_job(command=SLEEPER, gpus_per_node=1), JobStatus.RUNNING, timeout=120)
    first = running_attempt(job, 1)
    wait_until(agent, lambda: any("started attempt 1" in line for line in job_output(job)), "the run's first line")
    cursor = EvidenceCursor.objects.filter(node=first.node, source="nodecheck")
    wait_until(agent, cursor.exists, "the node's evidence read")
    agent.shutdown()  # the console stops; Slurm and the run go on
    down = time.time()
    gpu = first.gpu_indices[0]
    text = f"NVRM: Xid (PCI:{simulated_bus(gpu)}): 79, pid=4242, name=python, GPU has fallen off the bus."
    with open(slurm.kernel_log(first.node.name), "a") as kmsg:
        kmsg.write(f"3,1,{int((time.time() - boot_time()) * 1e6)},-;{text}\n")
    handed = evidence_paths(slurm.health_dir, first.node.name)["lines"]
    deadline = time.monotonic() + 30
    while not (handed.exists() and text in handed.read_text() and slurm_node(slurm, first.node.name).drained):
        assert time.monotonic() < deadline, "the node's check never handed the Xid over or never drained its node"
        time.sleep(0.2)
    assert slurm_node(slurm, first.node.name).reason.startswith("nodecheck: Xid 79"), slurm_node(slurm, first.node.name).reason
    time.sleep(max(0.0, down + 7 - time.time()))  # past the new monitor's grace: only the cursor finds it

    back = SlurmEngine(list(agent.node_names))
    back.start()
    try:
        wait_until(back, lambda: JobAttempt.objects.filter(job=job, number=2, state="running").exists(), "attempt 2 running", timeout=90)
        job.refresh_from_db()
        assert job.failover_count == 1 and running_attempt(job, 2).node != first.node
        assert list(HealthEvent.objects.filter(node=first.node, source="kmsg").values_list("gpu", "xid", "fatal")) == [(gpu, 79, True)]
        wait_until(back, lambda: "Xid 79" in slurm_node(slurm, first.node.name).reason, "the node drained in Slurm with the Xid", timeout=30)
    finally:
        back.shutdown()


def test_the_container_of_a_run_slurm_killed_is_removed_by_the_epilog(make_job, drive, agent, slurm):
    from agent import rootless, runfiles
    from agent.processes import run_dir

    job = drive(make_job(command=SLEEPER, gpus_per_node=1, failover_enabled=False), JobStatus.RUNNING, timeout=120)
    part = running_attempt(job, 1)
    wait_until(agent, lambda: any("started attempt 1" in line for line in job_output(job)), "the run's first line")
    policy = runfiles.spec_container(run_dir(part)) or {}

    part.refresh_from_db()
    account = pwd.getpwnam(slurm.user)
    # The run's container is the service account's, in its rootless storage on the run's node.
    env = rootless.engine_env(policy["rootless"]["storage"], part.node.name, uid=account.pw_uid, create=False)

    def container_exists() -> bool:
        found = subprocess.run(
            [policy["podman"], "container", "exists", policy["name"]], env=env, user=account.pw_uid, group=account.pw_gid, cwd="/", check=False
        )
        return found.returncode == 0

    assert container_exists()
    # SIGKILL to every process Slurm tracks for the job: the runner dies at once, Podman's
    # monitor (outside the job) keeps the container.
    slurm.client.run("scancel", "--signal=KILL", "--full", part.backend_job)
    wait_until(agent, lambda: not container_exists(), "the container removed", timeout=60)
    job = drive(job, {JobStatus.FAILED}, timeout=60)


def only_node_a_takes_work() -> None:
    Node.objects.exclude(name="node-a").update(cordoned=True)


def test_a_run_slurm_holds_shows_slurms_reason_until_it_starts(make_job, drive, agent, slurm):
    from jobs.backends.slurm.client import Submission

    only_node_a_takes_work()
    other = slurm.client.submit(Submission(
        user=slurm.other_user,
        name="someone-else", script="#!/bin/bash\nsleep 8\n", output="/dev/null", workdir="/tmp", gpus_per_node=4, nodelist=("node-a",),
    ))  # fmt: skip
    job = make_job(command="echo ran", gpus_per_node=1)
    wait_until(agent, lambda: "Resources" in type(job).objects.get(pk=job.pk).status_reason, "Slurm's reason on the job", timeout=60)
    job.refresh_from_db()
    assert job.status == JobStatus.PENDING and "queued in Slurm" in job.status_reason, job.status_reason
    assert slurm.client.job(other).state == "RUNNING"
    # The console restarts meanwhile: its new agent finds the rank Slurm still holds.
    from agent.slurm import SlurmEngine

    restarted = SlurmEngine(list(agent.node_names))
    restarted.start()
    assert [q.handle for q in restarted.slurm.queued.values()] == [AttemptNode.objects.get(attempt__job=job).backend_job]
    wait_until(restarted, lambda: type(job).objects.get(pk=job.pk).status == JobStatus.COMPLETED, "completed", timeout=120)
    assert job_output(job) == ["ran"]


def slurm_seconds(stamp: str) -> float:
    """A time as ``scontrol`` prints it (``2026-12-06T18:40:01``, the cluster's local time)."""
    return time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S"))


def test_another_users_job_holding_a_nodes_gpus_never_delays_a_console_job_while_another_node_is_free(make_job, drive, agent, slurm):
    """Slurm places: a console job is never sent to the node another user's batch job holds (it
    would wait there on ``Resources`` while other nodes sit idle); the Nodes page says what Slurm
    has allocated there."""
    from console.pages.nodes import node_overview
    from jobs.backends.slurm.client import Submission

    other = slurm.client.submit(Submission(
        user=slurm.other_user,
        name="someone-else", script="#!/bin/bash\nsleep 120\n", output="/dev/null", workdir="/tmp", gpus_per_node=4, nodelist=("node-a",),
    ))  # fmt: skip
    wait_until(
        agent, lambda: Node.objects.get(name="node-a").backend_gpus_in_use == 4, "node-a's four GPUs allocated in Slurm, as the console reads it", timeout=60
    )
    node_a = next(view for view in node_overview() if view.node.name == "node-a")
    assert node_a.gpus_free == 0 and node_a.node.cpu_count and node_a.node.memory_mb == 2000, (node_a.gpus_free, node_a.node.cpu_count, node_a.node.memory_mb)
    job = make_job(command="echo ran on $SLURMD_NODENAME", gpus_per_node=1)
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    part = AttemptNode.objects.select_related("node").get(attempt__job=job)
    record = slurm.client.job(int(part.backend_job))
    assert record is not None and part.node.name != "node-a" and record.nodes == [part.node.name], (part.node.name, record)
    waited = slurm_seconds(record.record["StartTime"]) - slurm_seconds(record.record["SubmitTime"])
    assert waited <= 5, f"Slurm started the console's job {waited:.0f} s after its submission"
    assert job_output(job) == [f"ran on {part.node.name}"], job_output(job)
    # sacct's link back: the console's job, attempt and user.
    assert record.record.get("Comment") == f"satrain:job={job.pk}:attempt=1:user={job.owner.username}", record.record.get("Comment")
    assert slurm.client.job(other).state == "RUNNING"


TWO_RANKS = (
    'python -c "import datetime, os, torch, torch.distributed as dist; '
    "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'master', os.environ['MASTER_ADDR'], "
    "'launch', os.environ.get('SLURM_LAUNCH_NODE_IPADDR'), 'on', os.environ['SLURMD_NODENAME'], flush=True); "
    "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=60)); "
    "t = torch.tensor([float(os.environ['RANK']) + 1]); dist.all_reduce(t); print('sum', t.item(), flush=True); "
    # Without it, a rank that leaves while the other still talks to it may abort (SIGABRT).
    'dist.barrier(); dist.destroy_process_group()"'
)


def test_a_two_node_jobs_ranks_start_together_in_one_allocation_and_meet_at_its_master_addr(make_job, drive, agent, slurm, project):
    """One Slurm job per attempt, of its whole shape (``-N 2``, a GPU per node): ``srun`` starts
    both ranks at once on the nodes Slurm chose, and they meet at ``MASTER_ADDR``, the address of
    the allocation's first node (rank 0's), through torch's process group."""
    from agent import runfiles
    from agent.processes import run_dir

    project.multi_node_host_network = True  # Slurm's nodes are hosts of their own
    project.save()
    job = make_job(command=TWO_RANKS, node_count=2, gpus_per_node=1, env={"GLOO_SOCKET_IFNAME": "lo"})
    try:
        job = drive(job, JobStatus.COMPLETED, timeout=180)
    except AssertionError as error:  # what each rank printed, and where Slurm had them
        parts = AttemptNode.objects.select_related("node").filter(attempt__job=job)
        raise AssertionError(f"{error}; output {job_output(job)}; ranks {[(p.rank, p.node.name, p.backend_job, p.runner_pid) for p in parts]}") from error
    parts = list(AttemptNode.objects.select_related("node").filter(attempt__job=job).order_by("rank"))
    assert len({part.backend_job for part in parts}) == 1, [part.backend_job for part in parts]  # one Slurm job
    record = slurm.client.job(int(parts[0].backend_job))
    assert record is not None and sorted(record.nodes) == sorted(part.node.name for part in parts) and len(record.nodes) == 2, record
    assert record.record.get("NumNodes") == "2", record.record.get("NumNodes")
    starts = [runfiles.read_pid(run_dir(part)).started_at for part in parts]
    assert max(starts) - min(starts) <= 2, f"the ranks started {max(starts) - min(starts):.1f} s apart"
    output = job_output(job, stream="master") + job_output(job, stream="worker-1")
    address = Node.objects.get(name=record.nodes[0]).address
    for part in parts:
        assert f"rank {part.rank} of 2 master {address} launch {address} on {part.node.name}" in output, output
    assert output.count("sum 3.0") == 2, output


def test_a_max_run_time_ends_as_max_run_time_exceeded_before_slurms_own_limit(make_job, drive, agent, slurm):
    """The console stops a job past its max run time and says so, as on the agents; Slurm's time
    limit is its backstop, later by the stop's room (SIGTERM, the grace period, SIGKILL)."""
    from datetime import timedelta

    from django.utils import timezone

    from jobs.models import TrainingJob

    job = drive(make_job(command="echo started; sleep 300", max_run_minutes=1), JobStatus.RUNNING, timeout=120)
    part = AttemptNode.objects.get(attempt__job=job)
    assert slurm.client.job(int(part.backend_job)).record.get("TimeLimit") == "00:03:00"  # 1 min + 1 + the grace's room
    TrainingJob.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=2))
    job = drive(job, JobStatus.STOPPED, timeout=60)
    assert job.status_reason.startswith("max run time of 1 min exceeded"), job.status_reason


def test_a_restarted_console_reads_a_queued_ranks_resume_step_from_its_spec(tmp_path):
    from agent import runfiles
    from agent.slurm import spec_resume_step

    assert spec_resume_step(tmp_path) is None  # no spec
    runfiles.write_spec(tmp_path, runfiles.RunSpec(command="true", cwd="/", env={"CKPT_LAST_STEP": "120"}))
    assert spec_resume_step(tmp_path) == 120
    runfiles.write_spec(tmp_path, runfiles.RunSpec(command="true", cwd="/", env={"CKPT_LAST_STEP": "-1; rm"}))
    assert spec_resume_step(tmp_path) is None


def test_a_run_uses_the_gpus_slurm_gave_it_and_the_console_follows(make_job, drive, agent, slurm):
    from jobs.backends.slurm.client import Submission
    from jobs.models import GPU

    only_node_a_takes_work()
    slurm.client.submit(Submission(
        user=slurm.other_user,
        name="someone-else", script="#!/bin/bash\nsleep 30\n", output="/dev/null", workdir="/tmp", gpus_per_node=1, nodelist=("node-a",),
    ))  # fmt: skip
    wait_until(agent, lambda: "ALLOCATED" in slurm_node(slurm, "node-a").state or "MIXED" in slurm_node(slurm, "node-a").state, "GPU 0 taken")
    job = make_job(command="echo gpus=$CUDA_VISIBLE_DEVICES; ls /dev | grep '^nvidia[0-9]'", gpus_per_node=1)
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    part = AttemptNode.objects.get(attempt__job=job)
    assert part.node.name == "node-a" and part.gpu_indices == [1], part.gpu_indices
    assert job_output(job) == ["gpus=1", "nvidia1"], job_output(job)
    assert not GPU.objects.filter(allocated_to__isnull=False).exists()  # released at the end, GPU 1's hold with it


# --- projects as Slurm accounts (a cluster that keeps accounts) ----------------------------
@pytest.fixture
def team(owner):
    project = Project.objects.create(name="team", gpu_quota=1, gpu_borrow_limit=1)
    project.members.add(owner)
    return project


@pytest.mark.slurm_accounting
def test_a_projects_job_runs_under_its_account_whose_gpu_limit_slurm_enforces(make_job, drive, agent, slurm, team):
    from jobs.backends.slurm.client import Submission

    client = slurm.client
    # The project's account exists already (an operator made it, with a looser limit), and
    # someone outside the console runs on it with 2 GPUs.
    client.set_account("satrain-team", gpu_limit=3, user=slurm.other_user)
    other = client.submit(Submission(
        user=slurm.other_user,
        name="outside", script="#!/bin/bash\nsleep 6\n", output="/dev/null", workdir="/tmp", gpus_per_node=2, account="satrain-team",
    ))  # fmt: skip
    job = make_job(command="echo on $SLURM_JOB_ACCOUNT; exit 0", gpus_per_node=1, project=team)
    # The console sets the account's limit to the project's quota plus borrow limit (2): Slurm
    # holds the job beyond it, and the job says why in Slurm's words and ours.
    wait_until(agent, lambda: "AssocGrpGRES" in (job.refresh_from_db() or job.status_reason), "Slurm's limit shown on the job", timeout=60)
    assert job.status == JobStatus.PENDING and "GPU limit" in job.status_reason, job.status_reason
    account = client.accounts()["satrain-team"]
    assert account.gpu_limit == 2 and slurm.user in account.users, account
    part = running_attempt(job, 1)
    record = client.job(int(part.backend_job))
    assert record is not None and record.record.get("Account") == "satrain-team" and record.reason == "AssocGrpGRES", record.record
    # Once the outside job ends, the account has room: the job runs and completes under it.
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    assert client.job(other) is None or client.job(other).state == "COMPLETED"
    assert job_output(job) == ["on satrain-team"], job_output(job)


@pytest.mark.slurm_accounting
def test_the_console_creates_the_account_and_it_follows_the_projects_quota(make_job, drive, agent, slurm, owner):
    lab = Project.objects.create(name="lab", gpu_quota=2, gpu_borrow_limit=0)
    lab.members.add(owner)
    assert "satrain-lab" not in slurm.client.accounts()
    job = drive(make_job(command="exit 0", gpus_per_node=1, project=lab), JobStatus.COMPLETED, timeout=120)
    assert job.failover_count == 0
    assert slurm.client.accounts()["satrain-lab"].gpu_limit == 2
    Project.objects.filter(pk=lab.pk).update(gpu_quota=3, gpu_borrow_limit=1)
    wait_until(agent, lambda: slurm.client.accounts()["satrain-lab"].gpu_limit == 4, "GrpTRES gres/gpu=4", timeout=30)
    Project.objects.filter(pk=lab.pk).update(gpu_borrow_limit=None)  # borrows without limit: no GPU limit in Slurm
    wait_until(agent, lambda: slurm.client.accounts()["satrain-lab"].gpu_limit is None, "no GPU limit", timeout=30)
    # Accounts without the prefix are the cluster's own: never touched.
    assert slurm.client.accounts()["root"].gpu_limit is None


@pytest.mark.slurm_accounting
def test_sacct_names_the_service_account_links_the_consoles_job_and_says_how_its_run_ended(make_job, drive, agent, slurm):
    fine = drive(make_job(command="echo fine", gpus_per_node=1), JobStatus.COMPLETED, timeout=120)
    broken = drive(make_job(command="python -c 'import no_such_module'", gpus_per_node=1), JobStatus.INTERNAL_ERROR, timeout=120)

    def accounted(job) -> list[str]:
        handle = AttemptNode.objects.get(attempt__job=job).backend_job
        deadline = time.monotonic() + 30
        while True:  # slurmdbd records the end a moment after the job ends
            rows = slurm.client.run("sacct", "-X", "-n", "-P", "-j", handle, "--format=User,State,ExitCode,Comment").split()
            if rows and not rows[0].split("|")[1].startswith(("RUNNING", "COMPLETING", "PENDING")):
                return rows[0].split("|")
            assert time.monotonic() < deadline, rows
            time.sleep(0.5)

    assert accounted(fine) == [slurm.user, "COMPLETED", "0:0", f"satrain:job={fine.pk}:attempt=1:user={fine.owner.get_username()}"]
    assert accounted(broken)[:3] == [slurm.user, "FAILED", "1:0"], accounted(broken)
