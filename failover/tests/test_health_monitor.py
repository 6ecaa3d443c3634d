"""The node health monitor: its own thread, a fatal GPU event stopping the run on that GPU at once
(a hung rank included) and failing it over, kernel lines read past a cursor, health events kept
per GPU, and the monitor (with NVML) shut down with the agent."""

from __future__ import annotations

import time

import psutil
import pytest

from agent import runfiles
from agent.processes import run_dir, run_processes
from failover.models import HealthEvent, NodeHealth
from failover.services import faults, health
from failover.services.monitor import HealthMonitor, prune_events
from failover.tests import fake_pynvml
from failover.tests.fake_agent import FakeAgent
from harness.node_agent import pump_until
from jobs.models import GPU, AttemptNode, JobAttempt, Node
from jobs.statuses import JobStatus
from logs.models import LogLine

# The tests that start real runs (all marked slow) ask for no_run_outlives_its_test; the others
# start none, and its clean-up waits on real processes.
CLEANS_UP_RUNS = pytest.mark.usefixtures("no_run_outlives_its_test")


HUNG = "python -c 'import time; print(\"step 1\", flush=True); time.sleep(600)'"


def first_attempt_processes(attempt: JobAttempt) -> list[psutil.Process]:
    out = []
    for part in AttemptNode.objects.filter(attempt=attempt).select_related("attempt"):
        record = runfiles.read_pid(run_dir(part))
        if record is not None and record.pgid is not None:
            out += [p for p in run_processes(record.pgid) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    return out


def only_on(node_name: str) -> None:
    Node.objects.exclude(name=node_name).update(cordoned=True)


def rounds_until(agent, done, timeout: float) -> float:
    """Run the agent on the console's schedule (``pump_until``) until ``done()``; returns the seconds it took."""
    started = time.monotonic()
    pump_until(agent, done, "done", timeout=timeout, every=0.05)
    return time.monotonic() - started


def exited(attempt: JobAttempt):
    return lambda: JobAttempt.objects.get(pk=attempt.pk).state == JobAttempt.State.EXITED


@pytest.mark.django_db
@pytest.mark.slow
@CLEANS_UP_RUNS
def test_a_hung_rank_on_a_gpu_that_fell_off_the_bus_is_failed_over_nvml(gpus, make_job, agent, drive):
    only_on("node-a")
    job = drive(make_job(command=HUNG), JobStatus.RUNNING)
    first = job.attempts.get()
    gpu = AttemptNode.objects.get(attempt=first).gpu_indices[0]
    Node.objects.update(cordoned=False)
    time.sleep(0.5)  # the rank is hung: it prints nothing more and never exits by itself

    gpus.lose(gpu)  # Xid 79, then every call on that GPU answers GPU_IS_LOST
    # The monitor kills the hung rank (it would never exit by itself); how fast is the failover
    # benchmark's figure (bench/failover), not this test's: a timed assertion failed at 5.7 s on
    # a loaded CI machine.
    rounds_until(agent, exited(first), timeout=30)

    assert first_attempt_processes(first) == []
    job = drive(job, JobStatus.RUNNING, timeout=30)
    assert job.failover_count == 1 and job.attempts.count() == 2
    assert JobAttempt.objects.get(pk=first.pk).verdict == "hardware"
    assert AttemptNode.objects.get(attempt__job=job, attempt__number=2).node.name != "node-a"
    events = HealthEvent.objects.filter(node__name="node-a", gpu=gpu, fatal=True)
    assert {(e.kind, e.source) for e in events} >= {("xid", "nvml"), ("gpu_lost", "nvml")}
    assert not GPU.objects.get(node__name="node-a", index=gpu).healthy


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["simulated", "nvml"])
@CLEANS_UP_RUNS
def test_on_its_own_thread_a_gpu_loss_stops_a_hung_rank_without_an_agent_round(backend, request, nodes, make_job, settings):
    """The agent's full rounds are 60 s apart here: only the monitor's thread can stop the run,
    and only collecting exits (every OUTPUT_POLL_INTERVAL) can re-place it. Through NVML (the
    fake pynvml's GPU falls off the bus) and through simulated GPUs (an injected GPU loss)."""
    import threading

    from agent.loop import EmbeddedControlLoop
    from agent.node_agent import NodeAgent

    driver = request.getfixturevalue("gpus") if backend == "nvml" else None
    if driver is not None:
        only_on("node-a")
    settings.HEALTH_MONITOR_INTERVAL = 0.2
    job = make_job(command=HUNG)
    monitors_before = {t for t in threading.enumerate() if t.name.startswith("health-monitor")}
    loop = EmbeddedControlLoop(NodeAgent([n.name for n in nodes]), interval=60)
    loop.start()  # its first round places and launches the job
    try:
        deadline = time.monotonic() + 30
        while not (first := JobAttempt.objects.filter(job=job, state=JobAttempt.State.RUNNING).first()):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        part = AttemptNode.objects.select_related("node").get(attempt=first)
        Node.objects.update(cordoned=False)
        time.sleep(0.5)
        started = time.monotonic()
        if driver is not None:
            driver.lose(part.gpu_indices[0])
        else:
            faults.inject_fault(part.node, kind="gpu_lost", gpu=part.gpu_indices[0])
        while first_attempt_processes(first):
            assert time.monotonic() - started < 10, "the hung rank was not stopped"
            time.sleep(0.05)
        stopped = time.monotonic() - started
        while (job := job.__class__.objects.get(pk=job.pk)).failover_count < 1 or job.status != JobStatus.RUNNING:
            assert time.monotonic() - started < 30, f"{job.status}: {job.status_reason}"
            time.sleep(0.1)
        fault = HealthEvent.objects.filter(node=part.node, gpu=part.gpu_indices[0], kind="gpu_lost", source=backend, fatal=True)
        while not fault.exists():
            assert time.monotonic() - started < 30, "the fault was never recorded"
            time.sleep(0.1)
    finally:
        loop.stop()
        loop.join(15)

    assert stopped < 3
    assert not loop.is_alive() and not any(t.name.startswith("health-monitor") and t.is_alive() and t not in monitors_before for t in threading.enumerate())
    assert fault.count() == 1
    assert AttemptNode.objects.get(attempt__job=job, attempt__number=2).node_id != part.node_id
    if driver is not None:  # NVML was shut down with the agent's loop
        assert driver.inits == 1 and driver.shutdowns == 1 and not driver.event_sets


@pytest.mark.django_db
def test_kernel_lines_are_events_on_their_gpu_and_an_old_line_never_reflags_a_cleared_node(gpus, settings):
    checker = health.HealthChecker(FakeAgent())
    node = Node.objects.get(name="node-a")
    kmsg = settings.KERNEL_LOG_PATH
    now = int(time.monotonic() * 1e6)  # /dev/kmsg stamps records with the time since boot
    with open(kmsg, "a") as f:
        f.write("3,1,100,-;NVRM: Xid (PCI:0000:18:00): 79, pid=7, name=python, GPU has fallen off the bus.\n")  # long ago
        f.write(f"6,2,{now},-;eth0: renamed\n")
        f.write(f"3,3,{now},-;NVRM: Xid (PCI:0000:28:00): 79, pid=99, name=python, GPU has fallen off the bus.\n")
        f.write(f"6,4,{now},-;mlx5_core 0000:5e:00.0 mlx5_0: Link down\n")
        f.write(f"3,5,{now},-;Out of memory: Killed process 4321 (python) total-vm:1kB, anon-rss:1kB\n")
        f.write(f"3,6,{now},-;pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:38:00.0\n")
    try:
        assert checker.monitor.poll() == 5
        kinds = {(e.kind, e.gpu, e.xid, e.nic, e.source, e.fatal) for e in HealthEvent.objects.filter(node=node)}
        assert kinds == {
            ("xid", 0, 79, "", "kmsg", False),  # written before the monitor started: kept, not acted on
            ("xid", 1, 79, "", "kmsg", True),  # PCI 28:00 is GPU 1
            ("network_link_down", None, None, "mlx5_0", "kmsg", False),
            ("oom_kill", None, None, "", "kmsg", False),
            ("pcie_fatal", 2, None, "", "kmsg", False),  # the device the AER line names last: GPU 2
        }
        # Xid 79 is one GPU's fault (failover.xids): that GPU leaves placement by itself; a fatal
        # PCIe error and the InfiniBand port going down are the node's, and node health is derived
        # from the same events a verdict reads (one writer): the node leaves placement too.
        node.refresh_from_db()
        assert not node.healthy and node.health_reason == "kernel log: PCIe fatal (uncorrected) error"
        unhealthy = dict(GPU.objects.filter(node=node, healthy=False).values_list("index", "health_reason"))
        assert list(unhealthy) == [1] and "fallen off the bus" in unhealthy[1]
        assert NodeHealth.objects.get(node=node).kernel_log_note == ""

        faults.clear_node(node)
        for _ in range(3):  # the line is still in the ring; the cursor has passed it
            assert checker.monitor.poll() == 0
            checker.check(node)
        node.refresh_from_db()
        assert node.healthy and not GPU.objects.filter(node=node, healthy=False).exists()
    finally:
        checker.close()


@pytest.mark.django_db
@pytest.mark.slow  # the kernel log's fallbacks run this machine's journalctl and dmesg
def test_an_unreadable_kernel_log_is_shown_in_the_nodes_health(gpus, settings):
    settings.KERNEL_LOG_PATH = "/nonexistent/kmsg"
    checker = health.HealthChecker(FakeAgent())
    node = Node.objects.get(name="node-a")
    try:
        checker.check(node)
        checker.monitor.poll()
        assert "/nonexistent/kmsg" in NodeHealth.objects.get(node=node).kernel_log_note
    finally:
        checker.close()


@pytest.mark.django_db(transaction=True)  # the monitor's thread reads the nodes on its own connection
@pytest.mark.slow  # the agent's monitor thread, started and stopped
def test_the_monitor_thread_stops_and_nvml_shuts_down_with_the_agent(gpus):
    from agent.node_agent import NodeAgent

    agent = NodeAgent(["node-a"])
    [checker] = [p for p in agent.plugins if isinstance(p, health.HealthChecker)]
    agent.start()
    assert checker.monitor.running
    checker.monitor.poll()  # the probe is made: nvmlInit, the event set registered
    assert gpus.inits == 1 and len(gpus.event_sets) == 1

    agent.shutdown()

    assert not checker.monitor.running
    assert gpus.shutdowns == 1 and gpus.initialised == 0 and not gpus.event_sets and gpus.freed


@pytest.mark.django_db
def test_old_events_are_pruned(nodes, settings):
    from datetime import timedelta

    from django.utils import timezone

    settings.HEALTH_EVENT_RETENTION = 3600
    node = nodes[0]
    HealthEvent.objects.create(node=node, kind="xid", xid=13, source="nvml", at=timezone.now() - timedelta(hours=2))
    HealthEvent.objects.create(node=node, kind="xid", xid=79, source="nvml")
    assert prune_events() == 1
    assert list(HealthEvent.objects.values_list("xid", flat=True)) == [79]


def test_the_monitor_knows_which_events_are_fatal():
    from failover.evidence import Finding
    from failover.services.monitor import is_fatal

    # The catalogue's RESET_GPU / RESTART_BM Xids; not its IGNORE ones (121: a corrected C2C error).
    assert all(is_fatal(Finding(kind="xid", gpu=0, xid=x)) for x in (79, 95, 62, 109, 158))
    assert not any(is_fatal(Finding(kind="xid", gpu=0, xid=x)) for x in (13, 31, 43, 63, 94, 121))
    assert is_fatal(Finding(kind="gpu_lost", gpu=0)) and is_fatal(Finding(kind="recovery_action", gpu=0, value=2))
    assert not is_fatal(Finding(kind="ecc_uncorrected", gpu=0, value=1))
    assert HealthMonitor  # the monitor class the plug-in keeps


@pytest.mark.django_db
def test_a_verdict_reads_the_events_on_its_gpus_within_its_window(nodes):
    from datetime import timedelta

    from django.utils import timezone

    from failover.services.health import scoped_evidence

    node = nodes[0]
    since = timezone.now()
    HealthEvent.objects.create(node=node, kind="xid", gpu=1, xid=79, source="nvml", at=since - timedelta(minutes=5))  # before
    HealthEvent.objects.create(node=node, kind="ecc_uncorrected", gpu=3, value=2, source="nvml", at=since + timedelta(seconds=1))  # not ours
    HealthEvent.objects.create(
        node=node, kind="oom_kill", source="kmsg", at=since + timedelta(seconds=2), message="Out of memory: Killed process 4321 (python)"
    )

    quiet = scoped_evidence(node, gpus=[0, 1], since=since)
    assert quiet.findings == [] and quiet.kernel_findings == []
    assert not quiet.judge(exit_code=None, exit_signal=9).hardware  # the OOM killer's line explains a SIGKILL

    HealthEvent.objects.create(
        node=node,
        kind="xid",
        gpu=1,
        xid=48,
        source="kmsg",
        at=since + timedelta(seconds=3),
        message="NVRM: Xid (PCI:0000:28:00): 48, pid=1, name=python, DBE (Double Bit Error) ECC Error",
    )
    HealthEvent.objects.create(
        node=node,
        kind="thermal",
        gpu=0,
        value=0x40,
        source="nvml",
        at=since + timedelta(seconds=4),
        message="hardware slowdown clock reason in 3 readings within 60s",
    )
    evidence = scoped_evidence(node, gpus=[0, 1], since=since)
    assert [(f.kind, f.gpu, f.xid) for f in evidence.kernel_findings] == [("xid", 1, 48)]
    assert [(f.kind, f.gpu) for f in evidence.findings] == [("thermal", 0)]
    verdict = evidence.judge(exit_code=1)
    assert verdict.hardware and "48" in verdict.reason


def test_a_hardware_slowdown_counts_over_a_window_not_on_one_reading():
    from failover.nvml import HW_SLOWDOWN_MIN_READINGS, NvmlProbe

    driver = fake_pynvml.reset(gpus=2)
    probe = NvmlProbe("gpu-node", expected_gpus=2, nvml=fake_pynvml, timeout=1.0)
    try:
        driver.gpus[1].clock_reasons = fake_pynvml.nvmlClocksEventReasonHwSlowdown
        seen = [any(f.kind == "thermal" for f in probe.check().findings) for _ in range(HW_SLOWDOWN_MIN_READINGS + 1)]
        assert seen == [False] * (HW_SLOWDOWN_MIN_READINGS - 1) + [True, True]
        driver.gpus[1].clock_reasons = 0
        assert not any(f.kind == "thermal" for f in probe.check().findings)  # over as soon as it stops
    finally:
        probe.close()
        driver.release()


@pytest.mark.django_db
@pytest.mark.slow
@CLEANS_UP_RUNS
def test_a_run_whose_supervisor_never_reports_after_the_kill_is_ended_by_the_monitor(nodes, make_job, agent, drive, monkeypatch):
    """The run's supervisor is wedged (stopped): no exit record will come. The monitor ends the
    rank itself FATAL_EXIT_WAIT after its SIGKILL, and the job fails over."""
    import os
    import signal

    from failover.services import monitor as monitor_module

    monkeypatch.setattr(monitor_module, "FATAL_EXIT_WAIT", 1.0)
    job = drive(make_job(command=HUNG), JobStatus.RUNNING)
    first = job.attempts.get()
    part = AttemptNode.objects.select_related("node").get(attempt=first)
    rounds_until(agent, lambda: runfiles.pid_written(run_dir(part)) and LogLine.objects.filter(job=job).exists(), timeout=20)
    os.kill(part.runner_pid, signal.SIGSTOP)
    try:
        faults.inject_fault(part.node, kind="gpu_lost", gpu=part.gpu_indices[0])
        took = rounds_until(agent, exited(first), timeout=20)
        job = drive(job, JobStatus.RUNNING, timeout=30)
    finally:
        os.kill(part.runner_pid, signal.SIGCONT)

    assert took >= 1.0  # it waited for the stopped process before calling it unkillable
    first.refresh_from_db()
    assert "did not exit after SIGKILL" in first.cause and first.exit_signal == signal.SIGKILL
    assert job.failover_count == 1 and first.verdict == "hardware"


@pytest.mark.django_db
@pytest.mark.parametrize("backend", ["simulated", "nvml"])
def test_an_event_the_database_refused_is_stored_at_the_next_pass(backend, request, nodes, monkeypatch):
    """A write of an injected fault's events that the database refuses (held past its busy
    timeout) after the fault was marked applied loses no fault, nor an NVML event, which the
    driver does not say again once drained: both are kept and stored at the next pass."""
    from django.db.models.query import QuerySet

    from harness.database import refuse_once

    driver = request.getfixturevalue("gpus") if backend == "nvml" else None
    checker = health.HealthChecker(FakeAgent())
    node = Node.objects.get(name="node-a")
    refused = refuse_once(monkeypatch, QuerySet, "bulk_create", lambda qs, *_, **__: qs.model is HealthEvent)
    try:
        checker.monitor.poll()  # the probe is made (NVML), nothing to say yet
        if driver is not None:
            driver.lose(2)
        else:
            faults.inject_fault(node, kind="gpu_lost", gpu=2)
        checker.monitor.poll()  # refused: kept back
        assert refused and not HealthEvent.objects.filter(node=node, gpu=2, fatal=True).exists()
        checker.monitor.poll()  # stored
        assert HealthEvent.objects.filter(node=node, gpu=2, kind="gpu_lost", source=backend, fatal=True).count() == 1
        checker.monitor.poll()
        assert HealthEvent.objects.filter(node=node, gpu=2, kind="gpu_lost", source=backend, fatal=True).count() == 1  # once
    finally:
        checker.close()
