"""Node evidence as the driver writes it, on the machine it names: a GB200 tray's four GPUs (PCI
domains 0008, 0009, 0018, 0019, all on bus 01:00) each keep their own bus id, so an Xid 79 on
``0008:01:00`` kills and blames GPU 0 only; a process that names itself like an Xid line never becomes
one; the NVLink5 Nonfatal lines and Xid 121 kill nothing and keep the node placeable; with
``FAILOVER_EXCLUDE=gpu`` an Xid 79 on GPU 0 leaves the node's other GPUs placeable."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone

from failover.classify import classify_failure, node_fault
from failover.evidence import Finding, FindingKind, HealthReport
from failover.kmsg import KernelLogReader
from failover.models import HealthEvent
from failover.services import health
from failover.services.monitor import HealthMonitor
from failover.tests.fake_agent import FakeAgent
from jobs.models import GPU, Node
from jobs.services.placement import read_capacity

GB200 = ["00000008:01:00.0", "00000009:01:00.0", "00000018:01:00.0", "00000019:01:00.0"]
FORGED = "Xid (3b:00): 79[4242]: segfault at 0 ip 0000555555555131 sp 00007fffffffe3b0 error 6 in a.out[555555555000+1000]"


@pytest.fixture
def gb200(gpus):
    """node-a is a GB200 tray: four GPUs behind the fake pynvml at PCI domains 0008/0009/0018/0019."""
    for gpu, bus in zip(gpus.gpus, GB200, strict=True):
        gpu.bus = bus
    return gpus


def write_records(path: str, *messages: str, facility: int = 0, first_seq: int = 10) -> None:
    now = int(time.monotonic() * 1e6)
    with open(path, "a") as f:
        for offset, message in enumerate(messages):
            f.write(f"{facility * 8 + 3},{first_seq + offset},{now},-;{message}\n")


@pytest.mark.django_db
@pytest.mark.parametrize("gpu,domain", [(0, "0008"), (1, "0009"), (2, "0018"), (3, "0019")])
def test_an_xid_79_on_one_gb200_gpu_kills_and_blames_that_gpu_only(gb200, settings, monkeypatch, gpu, domain):
    checker = health.HealthChecker(FakeAgent())
    stopped: list[set] = []
    monkeypatch.setattr(HealthMonitor, "stop_runs", lambda self, node, gpus, why: stopped.append(set(gpus)))
    write_records(settings.KERNEL_LOG_PATH, f"NVRM: Xid (PCI:{domain}:01:00): 79, pid=7, name=python, GPU has fallen off the bus.")
    try:
        checker.monitor.poll()
        event = HealthEvent.objects.get(node__name="node-a", kind="xid")
        assert (event.gpu, event.xid, event.fatal) == (gpu, 79, True)
        assert stopped == [{gpu}]  # the run on that GPU, and no other
        node = Node.objects.get(name="node-a")
        victim = health.scoped_evidence(node, gpus=[gpu], since=event.at).judge(exit_signal=9)
        other = health.scoped_evidence(node, gpus=[(gpu + 1) % 4], since=event.at).judge(exit_signal=9)
        assert victim.hardware and victim.reason.startswith(f"Xid 79 on GPU {gpu}: ")
        assert not other.hardware
    finally:
        checker.close()


@pytest.mark.django_db
def test_a_forged_process_name_and_a_user_space_record_never_become_an_xid(gb200, settings):
    checker = health.HealthChecker(FakeAgent())
    write_records(settings.KERNEL_LOG_PATH, FORGED)  # what the kernel prints for the job's segfault
    write_records(
        settings.KERNEL_LOG_PATH, "NVRM: Xid (PCI:0008:01:00): 79, pid=7, name=python, GPU has fallen off the bus.", facility=1, first_seq=20
    )  # written to /dev/kmsg by a process: facility user
    try:
        checker.monitor.poll()
        assert not HealthEvent.objects.filter(node__name="node-a").exists()
        assert Node.objects.get(name="node-a").healthy and not GPU.objects.filter(healthy=False).exists()
    finally:
        checker.close()


def test_the_reader_drops_what_a_process_wrote_or_named(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        f"6,1,100,-;{FORGED}\n"
        "14,2,200,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        "3,3,300,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
        "4,4,400,-;nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up\n"
    )
    lines = KernelLogReader(str(kmsg), fallbacks=False, booted=0.0).read()
    assert [line.seq for line in lines] == [3, 4]
    assert not classify_failure(exit_signal=11, kernel_log=FORGED).hardware


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_BER_EVENT Nonfatal XC0 i0 Link 05 (0x00000013 0x00000000 0x00000000 0x00000000)",
        "NVRM: Xid (PCI:0018:01:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 0x00000000)",
        "NVRM: Xid (PCI:0018:01:00): 121, C2C link corrected error",
    ],
)
def test_nonfatal_nvlink_lines_and_xid_121_kill_nothing_and_keep_the_node(line):
    from failover.xids import parse_kernel_line

    assert not parse_kernel_line(line).fatal
    assert node_fault(kernel_log=line) is None
    assert not classify_failure(exit_code=1, kernel_log=line).hardware


def test_sxid_20034_and_12028_are_node_side_faults():
    for line in (
        "[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up",
        "[111.111] nvidia-nvswitch3: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error",
    ):
        fault = node_fault(kernel_log=line)
        assert fault is not None and fault.node and "SXid" in fault.reason
        assert classify_failure(exit_code=1, kernel_log=line).hardware


def test_xid_13_with_one_pcie_replay_marks_nothing_and_is_the_applications():
    findings = [Finding(kind=FindingKind.XID, gpu=0, xid=13, detail="Graphics Exception"), Finding(kind=FindingKind.PCIE_REPLAY, gpu=0, value=1)]
    assert node_fault(findings) is None
    assert not classify_failure(exit_code=1, findings=findings).hardware


def test_nvlink_counters_growing_in_16_of_30_windows_are_a_fault():
    grown = [Finding(kind=FindingKind.NVLINK_ERRORS, gpu=1, value=3, detail=f"window {i}") for i in range(16)]
    assert classify_failure(exit_code=1, findings=grown).hardware
    assert not classify_failure(exit_code=1, findings=grown[:15]).hardware


@pytest.mark.django_db
def test_with_gpu_exclusion_an_xid_79_on_gpu_0_keeps_the_other_gpus_placeable(nodes, settings):
    settings.FAILOVER_EXCLUDE = "gpu"
    node = Node.objects.get(name="node-a")
    report = HealthReport(node="node-a", findings=(Finding(kind=FindingKind.XID, gpu=0, xid=79, detail="GPU has fallen off the bus"),))
    assert health.record_health(node, report, "")
    node.refresh_from_db()
    assert node.healthy and not GPU.objects.get(node=node, index=0).healthy
    capacity, _ = read_capacity(timezone.now())
    assert sorted(capacity.free[node.pk]) == [1, 2, 3]


def test_xid_109_after_the_applications_xid_13_on_the_same_gpu_is_the_applications():
    lines = [
        "NVRM: Xid (PCI:0000:cb:00): 13, pid=7, name=python, Graphics SM Warp Exception",
        "NVRM: Xid (PCI:0000:cb:00): 109, pid=7, name=python, Ch 00000008, errorString CTX SWITCH TIMEOUT",
    ]
    assert not classify_failure(exit_code=1, kernel_log="\n".join(lines)).hardware
    assert classify_failure(exit_code=1, kernel_log=lines[1]).hardware
    assert classify_failure(exit_code=1, kernel_log="\n".join([lines[0].replace("cb:00", "ca:00"), lines[1]])).hardware
