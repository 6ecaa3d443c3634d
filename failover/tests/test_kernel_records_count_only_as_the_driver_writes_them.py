"""Kernel records count only as the driver writes them (issue 42, "a job can forge a fatal kernel
record"): the kernel's record of a job's own trap, segfault or general-protection fault quotes the
process's name and the mapped file's, both the job's choice. Whatever driver text those names spell
(``NVRM: … fallen off the bus``, an Xid, an SXid, ``mlx5_core … Link down``, a PCIe AER fatal error …),
the health monitor's reading path (the kernel-log reader, the Slurm node's own check, the monitor's
event for a line) and the classifier (``classify_failure``, ``node_fault``) take no evidence from it;
genuine records, whose message starts with the driver's text, still count."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime

import pytest

from failover import nodecheck
from failover.classify import classify_failure, node_fault, parse_kernel_xids
from failover.evidence import Finding, FindingKind
from failover.kmsg import KernelLogReader
from failover.models import HealthEvent
from failover.services import health
from failover.services.monitor import HealthMonitor, NodeEvidenceMonitor, kernel_line_event
from failover.tests.fake_agent import FakeAgent
from failover.xids import parse_kernel_line
from jobs.models import GPU, Node

IP = "ip:00007f3a2b1c4d5e sp:00007ffd3d1f6d10 error:0"  # x86 traps' fields
SEGV = "ip 00007f3a2b1c4d5e sp 00007ffd3d1f6d10 error 4"  # x86 segfault's fields
MAP = "[7f3a2b1c0000+1000]"  # the mapped file's start and size, after its name

# What the kernel prints for a job's own fault, with driver text where the job chose: the mapped
# file's name (any length) or the process's (comm, at most 15 bytes: cut where the kernel cuts it).
FORGED = [
    f"traps: python3[4242] trap invalid opcode {IP} in NVRM: Xid (PCI:0000:18:00): 79, pid=1, GPU has fallen off the bus{MAP}",
    f"python3[77]: segfault at 0 {SEGV} in NVRM: GPU has fallen off the bus.so{MAP}",
    f"traps: NVRM: Xid (PCI:0000:18:00): 48[99] general protection fault {IP} in libc.so.6[7f3a2b000000+195000]",
    f"traps: NVRM: Xid (PCI:[99] general protection fault {IP} in libc.so.6[7f3a2b000000+195000]",
    f"traps: python3[4242] trap int3 {IP} in nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up{MAP}",
    f"python3[4242]: segfault at 7f00 {SEGV} in mlx5_core 0000:5e:00.0 mlx5_0: Link down.so{MAP} likely on CPU 3 (core 3, socket 0)",
    f"traps: python3[4242] trap divide error {IP} in pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0{MAP}",
    f"[ 8123.456789] traps: python3[4242] trap invalid opcode {IP} in NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.{MAP}",
    f"Feb 23 16:24:18 gpu-node-7 kernel: traps: python3[4242] general protection fault {IP} in NVRM: GPU 0000:18:00.0: GPU is lost{MAP}",
    f"[Sun Feb 23 16:24:18 2025] python3[4242]: segfault at 0 {SEGV} in NVRM: GPU at PCI:0000:18:00: GPU is lost{MAP}",
    f"traps: python3[4242] trap invalid opcode {IP} in NVRM: Timeout waiting for RPC from GSP0! Expected function 76{MAP}",
    f"traps: python3[4242] trap invalid opcode {IP} in thermal thermal_zone0: critical temperature reached (105 C), shutting down{MAP}",
    f"NVRM: GPU has f[4242]: segfault at 0 {SEGV} in fallen off the bus.so{MAP}",
    f"mlx5_core[4242]: segfault at 0 {SEGV} in 0000:5e:00.0 mlx5_0: Link down{MAP}",
    f"traps: python3[4242] general protection fault {IP} in mlx5_core 0000:5e:00.0 mlx5_0: Link down{MAP}",
    f"traps: nvidia-nvswitc[4242] trap invalid opcode {IP} in h0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30{MAP}",
    f"kernel: traps: python3[4242] trap stack segment {IP} in NVRM: Xid (PCI:0000:18:00): 119, pid=1, Timeout waiting for RPC from GSP!{MAP}",
    f"traps: kernel: NVRM: G[4242] trap invalid opcode {IP} in PU has fallen off the bus{MAP}",
    # A comm of unprintable bytes, as /dev/kmsg escapes them (\xNN): 15 bytes, 42 characters.
    "NVRM: " + "\\x01" * 9 + f"[4242]: segfault at 0 {SEGV} in GPU has fallen off the bus.so{MAP}",
    f"traps: python3[4242] trap invalid opcode {IP} in NVRM: Xid (PCI:0000:18:00): 149, NETIR_LINK_EVT/NETIR_LINK_DOWN "
    f"Fatal XC0 i0 Link 05 (0x00000011 0x00000000 0x00000000 0x00000000){MAP}",
]

GENUINE = [
    ("NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=python3, GPU has fallen off the bus.", "xid"),
    ("[131453.740743] nvidia-nvswitch0: SXid (PCI:0000:00:00.0): 20034, Fatal, Link 30 LTSSM Fault Up", "sxid"),
    ("[1084456.074566] NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.", "fallen_off_bus"),
    ("Dec  2 10:43:35 worker4 kernel: pcieport 0000:00:03.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0", "pcie_fatal"),
    ("mlx5_core 0000:5e:00.0 mlx5_0: Link down", "network_link_down"),
    ("NVRM: GPU at PCI:0000:18:00: GPU-1234 Timeout waiting for RPC from GSP!", "gsp_timeout"),
]


def kmsg_records(*messages: str, first_seq: int = 1) -> str:
    """/dev/kmsg records of the kernel's own facility, stamped now (the time since boot)."""
    usec = int(time.monotonic() * 1e6)
    return "".join(f"4,{first_seq + n},{usec},-;{message}\n" for n, message in enumerate(messages))


def test_there_are_twenty_forged_records():
    assert len(FORGED) == len(set(FORGED)) == 20


@pytest.mark.parametrize("record", FORGED)
def test_the_parser_reads_no_event_from_a_trap_or_segfault_record(record):
    assert parse_kernel_line(record) is None


def test_the_kernel_log_reader_keeps_none_of_them(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_records(*FORGED))
    reader = KernelLogReader(str(kmsg), fallbacks=False, booted=0.0)
    assert reader.read() == [] and reader.seq == 20


def test_a_slurm_nodes_own_check_hands_none_of_them_over(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_records(*FORGED))
    assert nodecheck.check("node-a", tmp_path / "health", kernel_log=str(kmsg)) == 0
    assert not (tmp_path / "health" / "node-a.jsonl").exists()


@pytest.mark.parametrize("record", FORGED)
def test_the_monitor_makes_no_known_or_fatal_event_of_one_even_when_a_node_file_holds_it(record, tmp_path):
    # A node's evidence file written before this rule (an older node check) is read as text and parsed again.
    (tmp_path / "node-a.jsonl").write_text(json.dumps({"seq": 1, "at": time.time(), "text": record}) + "\n")
    monitor = NodeEvidenceMonitor(None, directory=tmp_path, interval=1.0)
    [line] = monitor.read_node("node-a")
    at = datetime.fromtimestamp(line.at, tz=UTC)
    event = kernel_line_event(Node(name="node-a"), line.text, at=at, source="kmsg", gpu_by_pci={"0000:18:00": 0})
    assert (event.kind, event.xid, event.fatal, event.nic) == ("kernel", None, False, "")


@pytest.mark.parametrize("record", FORGED)
def test_classify_failure_takes_no_node_evidence_from_one(record):
    assert parse_kernel_xids(record) == []
    assert node_fault(kernel_log=record) is None
    verdict = classify_failure(exit_signal=9, kernel_log=record)
    assert not verdict.hardware
    assert verdict.evidence == {"source": "exit", "exit_signal": 9}  # the exit alone: nothing read from the record


def test_all_twenty_together_beside_a_failed_run_are_no_evidence():
    kernel_log = "\n".join(FORGED)
    assert node_fault(kernel_log=kernel_log) is None
    verdict = classify_failure(exit_code=1, kernel_log=kernel_log, log_lines=["Traceback (most recent call last):", "ValueError: bad batch"])
    assert not verdict.hardware and verdict.reason == "ValueError: bad batch"


def test_a_record_quoting_an_internal_error_neither_names_the_reason_nor_upgrades_a_failure():
    quoting = [
        f"traps: python3[4242] trap invalid opcode {IP} in illegal memory access was encountered{MAP}",
        f"python3[77]: segfault at 0 {SEGV} in CUDA out of memory.so{MAP}",
        f"traps: python3[4242] trap invalid opcode {IP} in Out of memory: Killed process 1 (python3){MAP}",
    ]
    supporting = [Finding(kind=FindingKind.PCIE_REPLAY, gpu=0, value=3)]
    verdict = classify_failure(exit_code=1, kernel_log="\n".join(quoting), findings=supporting)
    assert not verdict.hardware and verdict.reason == "exit code 1"


def test_the_oom_killers_own_record_still_names_a_host_oom_kill():
    verdict = classify_failure(exit_signal=9, kernel_log="[12.3] Out of memory: Killed process 4242 (python3) total-vm:1kB")
    assert verdict.evidence["signature"] == "host_oom_kill"


@pytest.mark.parametrize("record,kind", GENUINE)
def test_a_genuine_record_still_counts_on_every_path(record, kind, tmp_path):
    event = parse_kernel_line(record)
    assert event is not None and event.kind == kind
    assert classify_failure(exit_signal=9, kernel_log=record).hardware
    assert node_fault(kernel_log=record) is not None
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(kmsg_records(record))
    assert len(KernelLogReader(str(kmsg), fallbacks=False, booted=0.0).read()) == 1


def test_an_xid_whose_quoted_process_name_spells_a_trap_still_counts():
    # The driver's own record quoting a process: its code is read where the driver prints it, so a
    # job's name can hide nothing.
    event = parse_kernel_line("NVRM: Xid (PCI:0000:18:00): 79, pid=4242, name=traps: x[1] se, GPU has fallen off the bus.")
    assert event is not None and (event.kind, event.code, event.fatal) == ("xid", 79, True)


def test_a_journal_record_with_a_line_break_in_its_file_name_is_one_record():
    # journald restores the line breaks /dev/kmsg escaped: the reader keeps each record on one line.
    record = f"traps: python3[4242] trap invalid opcode {IP} in a\nNVRM: GPU has fallen off the bus\nb{MAP}"
    assert parse_kernel_line(record) is None
    assert node_fault(kernel_log=kernel_line_event(Node(name="node-a"), record, at=datetime.now(UTC), source="journalctl", gpu_by_pci={}).message) is None


@pytest.mark.django_db
def test_on_a_gpu_node_the_health_monitor_kills_nothing_and_marks_nothing_for_them(gpus, settings, monkeypatch):
    checker = health.HealthChecker(FakeAgent())
    stopped: list[set] = []
    monkeypatch.setattr(HealthMonitor, "stop_runs", lambda self, node, gpus, why: stopped.append(set(gpus)))
    with open(settings.KERNEL_LOG_PATH, "a") as f:
        f.write(kmsg_records(*FORGED))
    try:
        assert checker.monitor.poll() == 0
        assert stopped == [] and not HealthEvent.objects.filter(node__name="node-a").exists()
        assert Node.objects.get(name="node-a").healthy and not GPU.objects.filter(healthy=False).exists()

        # A genuine Xid 79 after them still kills the run on its GPU and marks that GPU.
        with open(settings.KERNEL_LOG_PATH, "a") as f:
            f.write(kmsg_records(GENUINE[0][0], first_seq=30))
        assert checker.monitor.poll() == 1
        assert stopped == [{0}] and list(GPU.objects.filter(healthy=False).values_list("index", flat=True)) == [0]
    finally:
        checker.close()
