"""A real Slurm cluster (three ``slurmd`` on this host, fake GPUs as GRES) driven by the
console's Slurm client: placement with GPUs, the failover verbs (drain with a reason, requeue,
exclude, start now), output kept across a requeue, and a drained node returned to service.

Needs root and Debian's ``slurm-wlm`` and ``munge``; CI installs them (``REQUIRE_SLURM=1``),
elsewhere the tests are skipped with what is missing."""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.slurm import account_dir, reset, work_root
from jobs.backends.slurm.client import SlurmClient, SlurmError, Submission, expand_nodes, parse_record
from jobs.backends.slurm.cluster import SERVICE_ACCOUNT, LocalSlurmCluster


@pytest.fixture
def tmp_path(slurm_cluster: LocalSlurmCluster) -> Path:
    """This module's tests' directory is beside the cluster's files, not in pytest's own: every
    pytest that starts makes ``/tmp/pytest-of-<user>`` 0700 again, and the cluster's jobs (its
    service account) must reach it."""
    return work_root(slurm_cluster)


@pytest.fixture
def cluster(slurm_cluster: LocalSlurmCluster, tmp_path: Path) -> Iterator[LocalSlurmCluster]:
    """The session's cluster alone (the Slurm client's tests, no console on it), left as it was
    found. Its jobs run as its service account (``DisableRootJobs``): the test's directory is that
    account's."""
    account_dir(slurm_cluster, tmp_path)
    yield slurm_cluster
    reset(slurm_cluster)


def test_scontrol_records_are_read_with_spaces_in_values() -> None:
    record = parse_record("JobId=7 JobName=train it JobState=PENDING Reason=ReqNodeNotAvail, UnavailableNodes:node-a ExcNodeList=(null) Restarts=1")
    assert record == {"JobId": "7", "JobName": "train it", "JobState": "PENDING",
                      "Reason": "ReqNodeNotAvail, UnavailableNodes:node-a", "ExcNodeList": "", "Restarts": "1"}  # fmt: skip
    assert expand_nodes("node-a,gpu[01-03],cpu[7,9]") == ["node-a", "gpu01", "gpu02", "gpu03", "cpu7", "cpu9"]
    assert expand_nodes("") == []


def test_a_nodes_record_gives_its_real_size_address_and_the_gpus_slurm_allocated() -> None:
    from jobs.backends.slurm.client import SlurmNode

    node = SlurmNode.from_record(parse_record(
        "NodeName=gpu07 Arch=x86_64 CoresPerSocket=1 CPUAlloc=2 CPUTot=64 Gres=gpu:a100:8(S:0-1) NodeAddr=10.0.3.7 "
        "NodeHostName=gpu07 RealMemory=515000 State=MIXED GresUsed=gpu:a100:3(IDX:0-2) AllocTRES=cpu=2 Reason=(null)"
    ))  # fmt: skip
    assert (node.gpus, node.cpus, node.memory_mb, node.address, node.gpus_in_use) == (8, 64, 515000, "10.0.3.7", 3)
    idle = SlurmNode.from_record(parse_record("NodeName=gpu08 CPUTot=64 Gres=gpu:8 State=IDLE GresUsed=gpu:0 RealMemory=1"))
    assert (idle.gpus_in_use, idle.address) == (0, "")


def test_a_jobs_environment_never_names_what_sbatch_itself_reads() -> None:
    """Its values reach sbatch's own environment: SBATCH_* and SLURM_* there are options (another
    partition, account, config file), LD_* the loader's. Refused before anything runs."""
    client = SlurmClient(env={"SLURM_CONF": "/nonexistent/slurm.conf"})
    for name in ("SBATCH_PARTITION", "SLURM_CONF", "LD_PRELOAD", "SPANK_X", "A,B", "1X"):
        with pytest.raises(SlurmError, match="not submitted: the job's environment names"):
            client.submit(Submission(name="env", script="#!/bin/bash\ntrue\n", output="/dev/null", workdir="/", environment={name: "x"}))


def test_the_scheduler_and_placement_agree_which_node_takes_work() -> None:
    """One rule (``state_takes_work``) for the scheduler's node views and for placement, which
    reads the state the Slurm agent mirrors into ``Node.backend_state``: a node not responding
    (``IDLE*``) or failing behind another word takes no work in either."""
    from jobs.backends.base import state_takes_work
    from jobs.backends.slurm.client import SlurmNode
    from jobs.backends.slurm.scheduler import SlurmScheduler

    states = {"IDLE": True, "MIXED": True, "ALLOCATED": True, "IDLE+DRAIN": False, "MIXED+DRAIN": False, "DOWN*": False,
              "IDLE*": False, "IDLE+NOT_RESPONDING": False, "MIXED+FAIL": False, "FAIL": False}  # fmt: skip

    class Nodes(SlurmClient):
        def nodes(self) -> list[SlurmNode]:
            return [SlurmNode(name=state, state=state, reason="", gpus=4) for state in states]

    views = {view.name: view.takes_work for view in SlurmScheduler(Nodes()).nodes()}
    assert views == states == {state: state_takes_work(state) for state in states}


def wait_for(client: SlurmClient, job_id: int, states: set[str], timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        job = client.job(job_id)
        if job is not None and job.state in states:
            return job
        assert time.monotonic() < deadline, f"job {job_id} never reached {states}: {job}"
        time.sleep(0.1)


def wait_for_line(path: Path, text: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        content = path.read_text() if path.exists() else ""
        if text in content:
            return content
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}: {content[-2000:]!r}"
        time.sleep(0.1)


SCRIPT = """#!/bin/bash
echo "start restart=${SLURM_RESTART_COUNT:-0} node=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES token=${TOKEN:-unset} home=${CONSOLE_SECRET:-unset}"
trap 'echo "got SIGTERM on $SLURMD_NODENAME"; exit 143' TERM
for i in $(seq 1 600); do sleep 0.1; done
"""


@pytest.mark.slow
def test_a_gpu_job_runs_with_its_gpus_and_only_its_own_environment(cluster: LocalSlurmCluster, tmp_path: Path) -> None:
    client = cluster.client
    output = tmp_path / "job.log"
    os.environ["CONSOLE_SECRET"] = "never in a job"
    try:
        job_id = client.submit(Submission(name="gpus", user=cluster.user, script=SCRIPT, output=str(output), workdir=str(tmp_path),
                                          gpus_per_node=2, environment={"TOKEN": "t-1"}))  # fmt: skip
    finally:
        del os.environ["CONSOLE_SECRET"]
    job = wait_for(client, job_id, {"RUNNING"})
    assert len(job.nodes) == 1
    line = wait_for_line(output, "start restart=0")
    assert f"node={job.nodes[0]} gpus=0,1 token=t-1 home=unset" in line
    client.cancel(job_id)
    # A PATH in the job's environment is the job's, not where the console finds sbatch.
    (tmp_path / "bin").mkdir()
    fake = tmp_path / "bin" / "sbatch"
    fake.write_text(f"#!/bin/sh\ntouch {tmp_path / 'fake-ran'}\necho 999999\n")
    fake.chmod(0o755)
    job_id = client.submit(Submission(name="path", user=cluster.user, script=SCRIPT, output=str(output), workdir=str(tmp_path),
                                      environment={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"}))  # fmt: skip
    assert job_id != 999999 and not (tmp_path / "fake-ran").exists()
    client.cancel(job_id)
    assert wait_for(client, job_id, {"CANCELLED"}).state == "CANCELLED"


@pytest.mark.slow
def test_a_job_opens_only_the_gpus_slurm_gave_it_and_root_may_not_submit(cluster: LocalSlurmCluster, tmp_path: Path) -> None:
    """``ConstrainDevices=yes``: the allocated GPU opens (no driver: ENXIO), the node's others are
    denied by the job's devices cgroup (EPERM) though their mode lets anyone open them;
    ``DisableRootJobs=YES``: root's own job is refused."""
    client = cluster.client
    output = tmp_path / "devices.log"
    opens = (
        "import os, sys\nfor i in range(4):\n try: os.open(f'{sys.argv[1]}/nvidia{i}', os.O_RDWR)\n"
        " except OSError as e: print(i, e.errno == 6 and 'opens' or e.strerror)"
    )
    script = f"#!/bin/bash\necho gpus=$SLURM_JOB_GPUS\n/usr/bin/python3 -c {shlex.quote(opens)} {cluster.device_dir}/$SLURMD_NODENAME\n"
    job_id = client.submit(Submission(name="devices", user=cluster.user, script=script, output=str(output), workdir=str(tmp_path), gpus_per_node=1))
    wait_for(client, job_id, {"COMPLETED"})
    first, *lines = output.read_text().splitlines()
    given = int(first.removeprefix("gpus="))
    assert lines == [f"{i} {'opens' if i == given else 'Operation not permitted'}" for i in range(4)], lines
    with pytest.raises(SlurmError, match="Invalid user id"):
        client.submit(Submission(name="as-root", script="#!/bin/bash\ntrue\n", output="/dev/null", workdir="/tmp"))


@pytest.mark.slow
def test_failover_drains_the_node_requeues_and_runs_elsewhere_with_the_log_kept(cluster: LocalSlurmCluster, tmp_path: Path) -> None:
    client = cluster.client
    output = tmp_path / "job.log"
    job_id = client.submit(Submission(name="failover", user=cluster.user, script=SCRIPT, output=str(output), workdir=str(tmp_path), gpus_per_node=1))
    first = wait_for(client, job_id, {"RUNNING"}).nodes[0]
    wait_for_line(output, "start restart=0")
    began = time.monotonic()

    client.drain(first, "Xid 79 on GPU 0: GPU has fallen off the bus")
    client.requeue(job_id)
    pending = wait_for(client, job_id, {"PENDING"})
    client.exclude_and_start(job_id, [*pending.excluded, first])
    second = wait_for(client, job_id, {"RUNNING"})
    content = wait_for_line(output, "start restart=1")
    moved_in = time.monotonic() - began

    assert second.nodes[0] != first and second.restarts == 1 and first in second.excluded
    assert f"got SIGTERM on {first}" in content  # the first run was asked to stop, its lines kept
    assert content.index("start restart=0") < content.index("start restart=1")
    drained = {node.name: node for node in client.nodes()}[first]
    assert drained.drained and drained.reason == "Xid 79 on GPU 0: GPU has fallen off the bus"
    assert moved_in < 30, moved_in

    client.resume(first)  # an operator's Mark healthy
    assert not {node.name: node for node in client.nodes()}[first].drained
    client.cancel(job_id)


# --- the Backend interface on Slurm ---------------------------------------------------------------


def observe_until(backend, handle: str, phases: set[str], timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        seen = backend.observe([handle])[handle]
        if seen.phase in phases:
            return seen
        assert time.monotonic() < deadline, f"{handle} never reached {phases}: {seen}"
        time.sleep(0.1)


@pytest.fixture
def backend(cluster: LocalSlurmCluster):
    from jobs.backends.slurm.scheduler import SlurmScheduler

    return SlurmScheduler(cluster.client)


def spec(tmp_path: Path, command: str, **fields):
    from jobs.backends.slurm.scheduler import AttemptSpec

    return AttemptSpec(key=f"job-1-attempt-{len(list(tmp_path.iterdir()))}", command=command, workdir=str(tmp_path),
                       output=str(tmp_path / "out.log"), user=SERVICE_ACCOUNT, **fields)  # fmt: skip


@pytest.mark.slow
def test_an_attempt_runs_exits_with_its_code_and_a_quoted_command_arrives_whole(backend, tmp_path: Path) -> None:
    handle = backend.submit(spec(tmp_path, "echo \"it's $((6*7))\" 'a;b' $STEP; exit 3", gpus_per_node=1, environment={"STEP": "s1"}))
    seen = observe_until(backend, handle, {"exited"})
    assert (seen.exit_code, seen.exit_signal, seen.state) == (3, None, "FAILED")
    assert "it's 42 a;b s1" in (tmp_path / "out.log").read_text()


@pytest.mark.slow
def test_a_stop_sends_sigterm_and_the_grace_period_ends_with_a_kill(backend, tmp_path: Path) -> None:
    handle = backend.submit(spec(tmp_path, "trap 'echo TERM seen' TERM; echo ready; while true; do sleep 0.1; done"))
    observe_until(backend, handle, {"running"})
    wait_for_line(tmp_path / "out.log", "ready")  # the trap is set (RUNNING comes before the script runs)
    backend.stop(handle, grace_s=1)
    wait_for_line(tmp_path / "out.log", "TERM seen")
    time.sleep(1.2)
    seen = observe_until(backend, handle, {"exited"})  # observe cancels it once the grace is over
    assert seen.state == "CANCELLED"


@pytest.mark.slow
def test_waiting_says_why_in_slurms_words_and_a_failover_requeues_elsewhere(backend, cluster, tmp_path: Path) -> None:
    from jobs.backends.slurm.client import SlurmError

    # No node could ever hold it: Slurm refuses it at once, in its own words.
    with pytest.raises(SlurmError, match="Requested node configuration is not available"):
        backend.submit(spec(tmp_path, "true", gpus_per_node=5))
    # Every GPU busy: the next one waits, and says why.
    fillers = [backend.submit(spec(tmp_path, "sleep 60", gpus_per_node=4)) for _ in cluster.nodes]
    for filler in fillers:
        observe_until(backend, filler, {"running"})
    queued = backend.submit(spec(tmp_path, "true", gpus_per_node=1))
    time.sleep(2.5)  # a scheduler pass (sched_interval=2)
    seen = backend.observe([queued])[queued]
    assert seen.phase == "waiting" and seen.reason in ("Resources", "Priority"), seen
    for handle in [*fillers, queued]:
        cluster.client.cancel(int(handle))

    handle = backend.submit(spec(tmp_path, "echo started on $SLURMD_NODENAME; sleep 60", gpus_per_node=4))
    first = observe_until(backend, handle, {"running"}).nodes[0]
    backend.drain(first, "Xid 79 on GPU 0")
    backend.requeue_excluding(handle, [first])
    again = observe_until(backend, handle, {"running"})
    assert again.nodes[0] != first and again.restarts == 1
    views = {node.name: node for node in backend.nodes()}
    assert not views[first].takes_work and views[first].reason == "Xid 79 on GPU 0" and views[first].gpus == 4
    backend.resume(first)
    # Slurm may mark a resumed node not responding (IDLE+NOT_RESPONDING, new work not allocated
    # there) until its slurmd answers the next ping: it takes work once it has.
    deadline = time.monotonic() + 30
    while not (view := {node.name: node for node in backend.nodes()}[first]).takes_work:
        assert time.monotonic() < deadline and not view.reason, view
        time.sleep(0.2)
    cluster.client.cancel(int(handle))


@pytest.mark.slow
def test_a_spot_job_is_preempted_by_on_demand_work_gets_sigterm_and_waits_again(cluster, tmp_path: Path) -> None:
    from jobs.backends.slurm.cluster import SPOT_PARTITION
    from jobs.backends.slurm.scheduler import SlurmScheduler

    backend = SlurmScheduler(cluster.client, spot_partition=SPOT_PARTITION)
    script = "trap 'echo SIGTERM: saving; sleep 1; exit 143' TERM; echo spot start $SLURM_RESTART_COUNT; while true; do sleep 0.1; done"
    spots = []
    for index, _ in enumerate(cluster.nodes):
        account_dir(cluster, tmp_path / f"spot{index}")
        spots.append(backend.submit(spec(tmp_path / f"spot{index}", script, gpus_per_node=4, spot=True)))
    for index, handle in enumerate(spots):
        observe_until(backend, handle, {"running"})
        wait_for_line(tmp_path / f"spot{index}" / "out.log", "spot start")  # its trap is set
    on_demand = backend.submit(spec(tmp_path, "echo on-demand; sleep 30", gpus_per_node=4))
    assert observe_until(backend, on_demand, {"running"}, timeout=60).phase == "running"
    seen = backend.observe(spots)
    preempted = [h for h in spots if seen[h].phase == "waiting" or seen[h].restarts > 0]
    assert len(preempted) == 1, seen
    [victim] = preempted
    log = tmp_path / f"spot{spots.index(victim)}" / "out.log"
    assert "SIGTERM: saving" in wait_for_line(log, "SIGTERM: saving")
    for handle in [*spots, on_demand]:
        cluster.client.cancel(int(handle))
