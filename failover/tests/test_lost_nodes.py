"""Lost nodes: a loss during a failover's placement is still a loss; the console never sweeps the
nodes its own agent serves; a node is Ready again when its heartbeat returns; on a multi-node
run the survivors are stopped before their GPUs are freed."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from failover.services import policy
from failover.tests.exits import report_exit, report_part_exit
from jobs.models import GPU, AttemptNode, JobAttempt, Node
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import run_started
from jobs.statuses import JobStatus
from logs.services import RawLine, ingest_lines

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_local_agent")]


def silence(node_name: str, seconds: float = 600) -> None:
    Node.objects.filter(name=node_name).update(last_heartbeat=timezone.now() - timedelta(seconds=seconds))


def started(job) -> JobAttempt:
    [attempt] = [a for a in place_waiting_jobs() if a.job_id == job.pk]
    AttemptNode.objects.filter(attempt=attempt).update(runner_pid=2**22 + 12345)  # no such process
    assert run_started(attempt)
    return JobAttempt.objects.get(pk=attempt.pk)


def test_a_node_lost_while_a_failover_is_being_placed_is_judged_a_lost_node(make_job, nodes):
    Node.objects.update(last_heartbeat=timezone.now())
    job = make_job()
    first = started(job)
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=[RawLine(1, timezone.now(), "RuntimeError: CUDA error: uncorrectable ECC error encountered")])
    assert report_exit(first, exit_code=1, exit_signal=None) == JobStatus.FAILOVER_IN_PROGRESS
    [second] = place_waiting_jobs()  # placed on node-b, not started yet
    assert second.placements.get().node.name == "node-b"
    silence("node-b")
    policy.control_round()
    job.refresh_from_db()
    second.refresh_from_db()
    assert job.status == JobStatus.FAILOVER_IN_PROGRESS, job.status_reason
    assert second.verdict == "hardware" and "node-b lost" in second.verdict_reason
    assert job.failover_count == 2
    assert not GPU.objects.filter(node__name="node-b", allocated_to__isnull=False).exists()
    [third] = place_waiting_jobs()
    assert third.placements.get().node.name == "node-c"


def test_a_start_reported_after_its_node_was_taken_as_lost_changes_nothing(make_job, nodes):
    """The agent claimed its rank, the sweep took the node as lost and ended the attempt, and only
    then did the run report its start (seen in the fleet benchmark: the jobs stayed Running with
    nobody collecting their exit). The late start must not bring the ended attempt back."""
    Node.objects.update(last_heartbeat=timezone.now())
    job = make_job()
    [attempt] = place_waiting_jobs()
    AttemptNode.objects.filter(attempt=attempt).update(runner_pid=2**22 + 12345)  # launched, not yet reported
    silence(attempt.placements.get().node.name)
    policy.control_round()
    attempt.refresh_from_db()
    assert attempt.state == JobAttempt.State.EXITED
    assert not run_started(attempt)
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.state == JobAttempt.State.EXITED and attempt.started_at is None
    assert job.status != JobStatus.RUNNING, job.status_reason


def test_the_console_never_sweeps_the_nodes_its_own_agent_serves(nodes, make_job):
    from agent.node_agent import NodeAgent

    local = NodeAgent([n.name for n in nodes])
    silence("node-a")  # its beat was held up (say, by a 40 s database lock) in this very process
    policy.control_round()
    assert Node.objects.get(name="node-a").state == Node.State.READY
    del local


def test_a_node_is_ready_again_when_its_heartbeat_returns(nodes, settings):
    from agent.node_agent import NodeAgent

    settings.JOB_SANDBOX = "off"  # no containers here: the revival's sweep of strays has nothing to ask Podman

    silence("node-a")
    policy.control_round()
    assert Node.objects.get(name="node-a").state == Node.State.NOT_READY
    NodeAgent(["node-a"]).heartbeat()
    node = Node.objects.get(name="node-a")
    assert node.state == Node.State.READY and node.health_reason == ""


def test_on_a_multi_node_run_the_survivors_are_stopped_before_their_gpus_are_freed(make_job, nodes):
    Node.objects.update(last_heartbeat=timezone.now())
    job = make_job(node_count=2, gpus_per_node=2)
    attempt = started(job)
    master, worker = attempt.placements.order_by("rank")
    assert (master.node.name, worker.node.name) == ("node-a", "node-b")
    silence("node-b")
    policy.control_round()
    attempt.refresh_from_db()
    # The lost node's GPUs are free; the survivor is asked to stop and keeps its GPUs meanwhile.
    assert attempt.state == JobAttempt.State.RUNNING and attempt.stop_requested_at is not None
    assert GPU.objects.filter(allocated_to=master).count() == 2
    assert GPU.objects.filter(allocated_to=worker).count() == 0
    assert GPU.objects.filter(allocated_to=master).count() == 2
    # The survivor's agent stopped it (SIGTERM): now the attempt closes and is judged a lost node.
    report_part_exit(AttemptNode.objects.select_related("attempt").get(pk=master.pk), exit_code=None, exit_signal=15)
    attempt.refresh_from_db()
    job.refresh_from_db()
    assert attempt.state == JobAttempt.State.EXITED
    assert GPU.objects.filter(allocated_to=master).count() == 0
    assert attempt.verdict == "hardware" and "node-b lost" in attempt.verdict_reason
    assert job.status == JobStatus.FAILOVER_IN_PROGRESS and job.failover_count == 1


@pytest.mark.slow  # a real process group on this host
def test_the_control_plane_never_signals_a_lost_nodes_run_from_its_own_host(make_job, nodes, settings, tmp_path):
    """With a shared JOB_WORK_ROOT the lost node's pid.json is readable here, naming a process group
    of that node, not of this host. Here it names a live group of this host: the sweep must close the
    part and leave the group alone (its node's agent ends the stray when it returns)."""
    import os
    import subprocess
    import time

    from agent import runfiles
    from agent.processes import run_dir

    settings.JOB_WORK_ROOT = str(tmp_path / "jobs")
    Node.objects.update(last_heartbeat=timezone.now())
    job = make_job()
    attempt = started(job)
    part = AttemptNode.objects.select_related("attempt").get(attempt=attempt)
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        directory = run_dir(part)
        directory.mkdir(parents=True)
        runfiles.write_pid(directory, runfiles.PidRecord(runner_pid=bystander.pid, pgid=bystander.pid, started_at=time.time()))
        assert runfiles.read_pid(directory).pgid == bystander.pid
        silence(part.node.name)
        policy.control_round()
        part.refresh_from_db()
        assert part.ended_at is not None and part.exit_code is None  # closed without an exit: to be ended by its agent
        assert bystander.poll() is None, "the control plane signalled a process group read from a run's files"
        os.kill(bystander.pid, 0)
    finally:
        bystander.kill()
        bystander.wait()


def test_the_banner_after_a_lost_node_says_node_lost_once(make_job, nodes):
    from logs.queries import attempt_banners

    Node.objects.update(last_heartbeat=timezone.now())
    job = make_job()
    first = started(job)
    lost_node = first.placements.get().node.name
    silence(lost_node)
    policy.control_round()
    Node.objects.exclude(name=lost_node).update(last_heartbeat=timezone.now())
    started(job)
    banner = attempt_banners(job.pk)[2]
    assert banner.count("lost") == 1, banner
    assert f"after node {lost_node} lost (no heartbeat for " in banner
    assert "GPU fault" not in banner


def test_the_recovery_metric_counts_a_lost_node_from_its_last_heartbeat(make_job, nodes, client, staff, settings):
    """The run was closed only a lease after its node fell silent: the outage an operator sees on
    /metrics is from the node's last beat to Running elsewhere, not the placement's fraction of a second."""
    from prometheus_client.parser import text_string_to_metric_families

    settings.METRICS_CACHE_SECONDS = 0
    Node.objects.update(last_heartbeat=timezone.now())
    job = make_job()
    first = started(job)
    lost_node = first.placements.get().node.name
    silence(lost_node, seconds=95)
    policy.control_round()
    Node.objects.exclude(name=lost_node).update(last_heartbeat=timezone.now())
    second = started(job)
    client.force_login(staff)
    text = client.get("/metrics").content.decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if not s.labels}
    assert values["satrain_failover_recovery_seconds_count"] == 1
    first.refresh_from_db()
    outage = (second.started_at - first.ended_at).total_seconds() + 95
    assert values["satrain_failover_recovery_seconds_sum"] == pytest.approx(outage, abs=1.5)
    assert first.verdict_reason.count("lost") == 1, first.verdict_reason


def redis_or_skip(settings, monkeypatch):
    from harness.scaleout import services_or_skip
    from jobs import heartbeats
    from jobs.services import messages

    _, redis_url = services_or_skip()
    settings.REDIS_URL = redis_url
    settings.SCALE_OUT = True
    monkeypatch.setattr(messages, "_redis", None)
    heartbeats.client().delete(heartbeats.BEATS, heartbeats.LOST, heartbeats.OUTAGE)
    return heartbeats


def test_in_scale_out_a_node_is_lost_a_short_lease_after_its_last_redis_beat(nodes, settings, monkeypatch):
    heartbeats = redis_or_skip(settings, monkeypatch)
    settings.NODE_HEARTBEAT_TIMEOUT = 12.0
    now = time.time()
    Node.objects.update(last_heartbeat=timezone.now() - timedelta(seconds=30))  # the database beat is rare (every 60 s)
    heartbeats.beat(["node-a", "node-c"], now - 1)
    heartbeats.beat(["node-b"], now - 13)
    policy.control_round()
    states = dict(Node.objects.values_list("name", "state"))
    assert states == {"node-a": "Ready", "node-b": "NotReady", "node-c": "Ready"}
    assert Node.objects.get(name="node-b").health_reason == "lost: no heartbeat for 13s"


def test_after_a_redis_flush_a_node_is_judged_by_its_database_beat_and_its_interval(nodes, settings, monkeypatch):
    redis_or_skip(settings, monkeypatch)  # no beat in Redis at all
    settings.NODE_HEARTBEAT_TIMEOUT = 12.0
    settings.NODE_HEARTBEAT_DB_INTERVAL = 60.0
    Node.objects.update(last_heartbeat=timezone.now() - timedelta(seconds=50))
    Node.objects.filter(name="node-c").update(last_heartbeat=timezone.now() - timedelta(seconds=80))
    policy.control_round()
    states = dict(Node.objects.values_list("name", "state"))
    assert states == {"node-a": "Ready", "node-b": "Ready", "node-c": "NotReady"}


def checked(**env: str) -> str:
    import os
    import subprocess
    import sys
    from pathlib import Path

    base = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "NODE_HEARTBEAT_TIMEOUT", "DJANGO_SETTINGS_MODULE")}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        check=False,
        cwd=Path(__file__).resolve().parents[2],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.stdout + done.stderr


@pytest.mark.slow  # manage.py check processes
def test_the_lease_check_warns_per_mode(tmp_path):
    """SQLite: the lease must outlast the busy timeout; PostgreSQL with Redis: 12 s is the default
    and passes, only a lease too short for one slow agent round warns."""
    sqlite = checked(CONSOLE_VAR_DIR=str(tmp_path), NODE_HEARTBEAT_TIMEOUT="12")
    assert "failover.W001" in sqlite and "database busy timeout (30s)" in sqlite and "at least 60" in sqlite
    scale_out = {"CONSOLE_VAR_DIR": str(tmp_path), "DATABASE_URL": "postgres://nobody@127.0.0.1:1/none", "REDIS_URL": "redis://127.0.0.1:1/0"}
    assert "failover.W" not in checked(**scale_out)
    short = checked(**scale_out, NODE_HEARTBEAT_TIMEOUT="3")
    assert "failover.W002" in short and "below 5s" in short and "failover.W001" not in short
