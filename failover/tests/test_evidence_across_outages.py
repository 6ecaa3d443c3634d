"""Evidence across outages: the health monitor reads each node's kernel evidence from where the
last console stopped (``EvidenceCursor``), so an Xid written while the console was down is read by
the next one (its run stopped, its GPU marked), once: a third console reads nothing again, a run
started after the record is not the record's, and a rotated or truncated file is read from its
start. Through a Slurm node's own check (``NodeEvidenceMonitor``) and this machine's kernel log."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from failover.kmsg import boot_time
from failover.models import EvidenceCursor, HealthEvent
from failover.services import health
from failover.tests.fake_agent import FakeAgent
from jobs.backends.facts import EvidenceSource, NodeCheckFiles
from jobs.models import GPU, AttemptNode, JobAttempt, Node
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import run_started

pytestmark = pytest.mark.django_db

XID = "NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python, GPU has fallen off the bus."  # GPU 0


@dataclass(eq=False)
class Agent(FakeAgent):
    """Signals nothing for real: it records what it was asked to send. ``directory`` set: a
    cluster's agent, whose nodes hand their evidence over as files (Slurm's)."""

    directory: Path | None = None
    sent: list = field(default_factory=list)

    def signal(self, part, sig: int) -> bool:
        self.sent.append((part.attempt.job_id, sig))
        return True

    def evidence_source(self) -> EvidenceSource:
        return NodeCheckFiles(self.directory) if self.directory is not None else super().evidence_source()


def console(agent: Agent) -> health.HealthChecker:
    """A console (its agent's health checker) started now."""
    return health.HealthChecker(agent)


def running_on_gpu0(make_job) -> JobAttempt:
    Node.objects.exclude(name="node-a").update(cordoned=True)
    job = make_job()
    [attempt] = place_waiting_jobs()
    assert run_started(attempt)
    AttemptNode.objects.filter(attempt=attempt).update(runner_pid=4242)
    assert AttemptNode.objects.get(attempt=attempt).gpu_indices == [0]
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=timezone.now() - timedelta(minutes=10))
    return JobAttempt.objects.get(pk=attempt.pk, job=job)


def gpu0_healthy() -> bool:
    return GPU.objects.get(node__name="node-a", index=0).healthy


# --- a Slurm node's own check: <node>.jsonl --------------------------------------------------
def handed_over(directory: Path, *texts: str, ago: float = 0.0) -> None:
    """What the node's check appends (``failover.nodecheck``), and its status (GPU 0 is 18:00)."""
    with (directory / "node-a.jsonl").open("a") as fh:
        for text in texts:
            fh.write(json.dumps({"seq": 1, "at": time.time() - ago, "text": text}) + "\n")
    (directory / "node-a.status.json").write_text(json.dumps({"checked_at": time.time(), "problem": "", "gpus_by_pci": {"0000:18:00": 0}}))


@pytest.fixture
def slurm_agent(gpus, tmp_path) -> Agent:
    directory = tmp_path / "health"
    directory.mkdir()
    handed_over(directory)
    return Agent(directory=directory)


def test_an_xid_handed_over_while_the_console_was_down_is_read_once_by_the_next(make_job, slurm_agent):
    attempt = running_on_gpu0(make_job)
    first = console(slurm_agent)
    assert first.monitor.poll() == 0  # the node's file, read to its end
    first.close()
    assert EvidenceCursor.objects.get(node__name="node-a", source="nodecheck").position == 0

    handed_over(slurm_agent.directory, XID, ago=30)  # the console is down
    second = console(slurm_agent)
    assert second.monitor.poll() == 1
    assert set(slurm_agent.sent) == {(attempt.job_id, signal.SIGKILL)}  # the run on the dead GPU is stopped
    event = HealthEvent.objects.get(node__name="node-a", xid=79)
    assert event.fatal and event.gpu == 0 and event.at <= timezone.now() - timedelta(seconds=30)  # with the kernel's time
    assert not gpu0_healthy()
    assert second.monitor.poll() == 0
    second.close()

    third = console(slurm_agent)  # read once: another restart reads nothing again
    slurm_agent.sent.clear()
    assert third.monitor.poll() == 0
    third.close()
    assert slurm_agent.sent == [] and HealthEvent.objects.filter(xid=79).count() == 1


def test_a_node_whose_check_had_handed_nothing_over_yet_was_read_all_the_same(make_job, slurm_agent):
    attempt = running_on_gpu0(make_job)
    (slurm_agent.directory / "node-a.jsonl").unlink()  # no fault line yet: the check makes the file with the first
    first = console(slurm_agent)
    first.monitor.poll()
    first.close()
    handed_over(slurm_agent.directory, XID, ago=30)  # the console is down
    second = console(slurm_agent)
    assert second.monitor.poll() == 1
    second.close()
    assert set(slurm_agent.sent) == {(attempt.job_id, signal.SIGKILL)}


def test_a_missed_record_older_than_the_run_is_stored_but_does_not_stop_it(make_job, slurm_agent):
    first = console(slurm_agent)
    first.monitor.poll()
    first.close()
    handed_over(slurm_agent.directory, XID, ago=3600)  # an hour ago: before the run started
    attempt = running_on_gpu0(make_job)
    JobAttempt.objects.filter(pk=attempt.pk).update(started_at=timezone.now() - timedelta(minutes=5))
    second = console(slurm_agent)
    assert second.monitor.poll() == 1
    second.close()
    assert slurm_agent.sent == []
    assert HealthEvent.objects.get(node__name="node-a", xid=79).fatal  # the GPU's fault: it leaves placement
    assert not gpu0_healthy()


def test_a_node_no_console_read_before_has_history(make_job, slurm_agent):
    running_on_gpu0(make_job)
    handed_over(slurm_agent.directory, XID, ago=3600)
    first = console(slurm_agent)
    assert first.monitor.poll() == 0  # from before any console watched the node
    first.close()
    assert slurm_agent.sent == [] and gpu0_healthy()


@pytest.mark.parametrize("how", ["rotated", "truncated"])
def test_a_rotated_or_truncated_file_is_read_from_its_start(how, make_job, slurm_agent):
    attempt = running_on_gpu0(make_job)
    path = slurm_agent.directory / "node-a.jsonl"
    handed_over(slurm_agent.directory, "usb 1-1: new high-speed USB device" * 5)
    first = console(slurm_agent)
    first.monitor.poll()
    first.close()
    assert EvidenceCursor.objects.get(node__name="node-a").position == path.stat().st_size > 0
    if how == "rotated":
        path.rename(path.with_suffix(".jsonl.1"))
    else:
        path.write_text("")  # the same file, shorter
    handed_over(slurm_agent.directory, XID, ago=30)
    assert path.stat().st_size < EvidenceCursor.objects.get(node__name="node-a").position or how == "rotated"
    second = console(slurm_agent)
    assert second.monitor.poll() == 1
    second.close()
    assert set(slurm_agent.sent) == {(attempt.job_id, signal.SIGKILL)}
    assert EvidenceCursor.objects.get(node__name="node-a").position == path.stat().st_size


def test_a_pass_the_database_refused_is_read_again_by_the_next_console(make_job, slurm_agent, monkeypatch):
    from django.db import OperationalError

    first = console(slurm_agent)
    first.monitor.poll()
    handed_over(slurm_agent.directory, XID)

    def refused(*args, **kwargs):
        raise OperationalError("database is locked")

    with monkeypatch.context() as refusing:
        refusing.setattr(HealthEvent.objects, "bulk_create", refused)
        assert first.monitor.poll() == 0  # kept back; where the file was read to is not stored either
    first.close()
    assert EvidenceCursor.objects.get(node__name="node-a").position == 0
    second = console(slurm_agent)
    assert second.monitor.poll() == 1
    second.close()
    assert HealthEvent.objects.filter(xid=79).count() == 1


# --- this machine's kernel log (the agents) --------------------------------------------------
def kmsg(path: str, seq: int, text: str, *, ago: float = 0.0) -> None:
    usec = int((time.time() - ago - boot_time()) * 1e6)
    with open(path, "a") as fh:
        fh.write(f"3,{seq},{usec},-;{text}\n")


def test_an_xid_the_kernel_wrote_while_the_console_was_down_is_read_once_by_the_next(make_job, gpus, settings):
    attempt = running_on_gpu0(make_job)
    agent = Agent()
    kmsg(settings.KERNEL_LOG_PATH, 1, XID.replace("18:00", "28:00"), ago=3600)  # the ring's backlog: history
    first = console(agent)
    assert first.monitor.poll() == 1
    first.close()
    assert agent.sent == [] and not HealthEvent.objects.get().fatal
    assert EvidenceCursor.objects.get(node__name="node-a", source="kernel").position == 1

    kmsg(settings.KERNEL_LOG_PATH, 2, XID, ago=30)  # the console is down
    second = console(agent)
    assert second.monitor.poll() == 1
    second.close()
    assert set(agent.sent) == {(attempt.job_id, signal.SIGKILL)}
    assert HealthEvent.objects.get(gpu=0).fatal and not gpu0_healthy()

    third = console(agent)
    agent.sent.clear()
    assert third.monitor.poll() == 0
    third.close()
    assert agent.sent == [] and HealthEvent.objects.count() == 2


def test_an_empty_kernel_log_was_read_all_the_same(make_job, gpus, settings):
    attempt = running_on_gpu0(make_job)
    agent = Agent()
    first = console(agent)
    assert first.monitor.poll() == 0
    first.close()
    kmsg(settings.KERNEL_LOG_PATH, 1, XID, ago=30)  # the console is down
    second = console(agent)
    assert second.monitor.poll() == 1
    second.close()
    assert set(agent.sent) == {(attempt.job_id, signal.SIGKILL)}


# --- the whole path: a run, the console down, an Xid, the console back ------------------------
@pytest.mark.slow
@pytest.mark.usefixtures("no_run_outlives_its_test")
def test_an_xid_written_while_the_console_was_down_fails_its_job_over_when_the_console_is_back(gpus, make_job, agent, drive, settings):
    """A hung run on node-a; the console (its agent, its health monitor) stops; the kernel writes
    an Xid 79 for the run's GPU; a new console starts: it reads the Xid it missed, kills the run,
    marks the GPU and fails the job over, once."""
    from agent.loop import embedded_round
    from agent.node_agent import NodeAgent
    from jobs.statuses import JobStatus

    Node.objects.exclude(name="node-a").update(cordoned=True)
    hung = "python -c 'import time; print(\"step 1\", flush=True); time.sleep(600)'"
    job = drive(make_job(command=hung), JobStatus.RUNNING)
    first = job.attempts.get()
    gpu = AttemptNode.objects.get(attempt=first).gpu_indices[0]
    embedded_round(agent)  # its monitor has read the kernel log: where to is stored
    assert EvidenceCursor.objects.filter(node__name="node-a", source="kernel").exists()
    agent.shutdown()  # the console stops; the run goes on
    Node.objects.update(cordoned=False)
    down = time.time()
    time.sleep(0.5)
    kmsg(settings.KERNEL_LOG_PATH, 1, f"NVRM: Xid (PCI:0000:{0x18 + gpu * 0x10:02x}:00): 79, pid=4242, name=python, GPU has fallen off the bus.")
    time.sleep(max(0.0, down + 7 - time.time()))  # past the new monitor's grace: only the cursor finds it

    back = NodeAgent(list(agent.node_names))
    try:
        deadline = time.monotonic() + 60
        while not JobAttempt.objects.filter(job=job, number=2, state=JobAttempt.State.RUNNING).exists():
            assert time.monotonic() < deadline, JobAttempt.objects.get(pk=first.pk).state
            embedded_round(back)
            time.sleep(0.1)
        job.refresh_from_db()
        assert job.failover_count == 1 and JobAttempt.objects.get(pk=first.pk).verdict == "hardware"
        assert AttemptNode.objects.get(attempt__job=job, attempt__number=2).node.name != "node-a"
        assert not GPU.objects.get(node__name="node-a", index=gpu).healthy
        assert HealthEvent.objects.filter(node__name="node-a", xid=79, fatal=True).count() == 1
    finally:
        back.shutdown()
    again = NodeAgent(list(agent.node_names))  # another restart: the Xid is not read again
    try:
        embedded_round(again)
    finally:
        again.shutdown()
    assert HealthEvent.objects.filter(node__name="node-a", xid=79).count() == 1
    job.refresh_from_db()
    assert job.failover_count == 1
