"""A cluster node's own health check (``failover.nodecheck``, Slurm's HealthCheckProgram) and the
console's reading of what it hands over (``NodeEvidenceMonitor``): the kernel's fault lines pass
once each, anything else is dropped, and nothing a file holds is trusted."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from failover import nodecheck
from failover.kmsg import boot_time
from failover.services.monitor import NodeEvidenceMonitor

XID = "NVRM: Xid (PCI:0000:28:00): 79, pid=4242, name=python, GPU has fallen off the bus."


def record(seq: int, text: str, *, ago: float = 0.0, prio: int = 3) -> str:
    usec = int((time.time() - ago - boot_time()) * 1e6)
    return f"{prio},{seq},{usec},-;{text}\n"


def lines_of(directory: Path, node: str = "node-a") -> list[dict]:
    path = nodecheck.evidence_paths(directory, node)["lines"]
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_pass_hands_over_the_kernels_fault_lines_once(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        record(1, XID, ago=600)  # in the ring before the first check: not news
        + record(2, "usb 1-1: new high-speed USB device")  # not a fault line
        + record(3, XID, prio=12)  # a process wrote it, not the kernel
        + record(4, XID)
    )
    out = tmp_path / "health"
    assert nodecheck.check("node-a", out, kernel_log=str(kmsg)) == 1
    assert [(r["seq"], r["text"]) for r in lines_of(out)] == [(4, XID)]
    assert nodecheck.check("node-a", out, kernel_log=str(kmsg)) == 0  # the cursor has passed it
    with kmsg.open("a") as fh:
        fh.write(record(5, XID.replace("79", "48")))
    assert nodecheck.check("node-a", out, kernel_log=str(kmsg)) == 1
    assert [r["seq"] for r in lines_of(out)] == [4, 5]
    status = json.loads((out / "node-a.status.json").read_text())
    assert status["problem"] == "" and status["gpus_by_pci"] == {}  # no NVML here


def test_an_unreadable_kernel_log_is_said_and_bad_names_or_links_are_refused(tmp_path, monkeypatch):
    out = tmp_path / "health"
    nodecheck.check("node-a", out, kernel_log=str(tmp_path / "missing"))
    assert "kernel log unreadable" in json.loads((out / "node-a.status.json").read_text())["problem"]
    with pytest.raises(ValueError):
        nodecheck.check("../etc", out, kernel_log=str(tmp_path / "missing"))
    # Root never follows a link someone left where the node's file goes.
    target = tmp_path / "elsewhere"
    target.write_text("")
    os.symlink(target, out / "node-b.jsonl")
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(record(1, XID))
    monkeypatch.setenv("SLURMD_NODENAME", "node-b")
    monkeypatch.setenv("SATRAIN_HEALTH_DIR", str(out))
    monkeypatch.setenv("SATRAIN_KERNEL_LOG", str(kmsg))
    assert nodecheck.main([]) == 1
    assert target.read_text() == ""
    monkeypatch.delenv("SATRAIN_HEALTH_DIR")
    assert nodecheck.main([]) == 2


def test_the_console_reads_each_record_once_and_trusts_none(tmp_path):
    monitor = NodeEvidenceMonitor(None, directory=tmp_path, interval=1.0)
    path = tmp_path / "node-a.jsonl"
    now = time.time()
    path.write_text(
        json.dumps({"seq": 1, "at": now - 3600, "text": XID}) + "\n"  # from long before the console watched
        + "not json\n"
        + json.dumps({"at": "yesterday", "text": XID}) + "\n"
        + json.dumps(["a", "list"]) + "\n"
        + json.dumps({"seq": 2, "at": now, "text": XID + "x" * 2000}) + "\n"
        + json.dumps({"seq": 3, "at": now, "text": XID})  # no newline yet: being written
    )  # fmt: skip
    (tmp_path / "node-a.status.json").write_text(json.dumps({"checked_at": now, "problem": "", "gpus_by_pci": {"0000:28:00": 1, "x": "y"}}))
    lines = monitor.read_node("node-a")
    assert [(line.seq, len(line.text)) for line in lines] == [(2, 500)]
    assert "node-a" not in monitor.pci  # a map with a bad entry is not used
    with path.open("a") as fh:
        fh.write("\n")
    assert [line.seq for line in monitor.read_node("node-a")] == [3]
    assert monitor.read_node("node-a") == []
    assert monitor.read_node("node-z") == []  # no file yet


XID13 = XID.replace("79, pid=4242, name=python, GPU has fallen off the bus.", "13, Graphics Exception")


@pytest.fixture
def scontrol(monkeypatch):
    """Slurm's scontrol, as the node's check runs it: each call's arguments, answered ``rc``."""
    calls: list[list[str]] = []
    answer = {"rc": 0}

    def run(command, **kwargs):
        calls.append(list(command))
        # What scontrol would have answered (no process is started).
        return SimpleNamespace(returncode=answer["rc"], stdout="", stderr="slurm_update error: Invalid node state" if answer["rc"] else "")

    monkeypatch.setattr(nodecheck.subprocess, "run", run)
    return calls, answer


def test_a_fatal_record_drains_the_node_where_the_site_asks_for_it(tmp_path, monkeypatch, scontrol):
    """``SATRAIN_DRAIN_ON_FAULT=1``: the node's check drains its own node on a fatal record (a
    GPU that fell off the bus), with the record as the reason, after handing it over; a record that
    is not fatal (Xid 13, a program's error) drains nothing, nor does a check the site did not ask
    to drain."""
    calls, _ = scontrol
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(record(1, XID, ago=600))
    out = tmp_path / "health"
    assert nodecheck.check("node-a", out, kernel_log=str(kmsg), scontrol="scontrol") == 0  # the ring's old lines are not news
    with kmsg.open("a") as fh:
        fh.write(record(2, XID13))
    assert nodecheck.check("node-a", out, kernel_log=str(kmsg), scontrol="scontrol") == 1
    assert calls == []  # Xid 13 is the program's
    with kmsg.open("a") as fh:
        fh.write(record(3, XID))
    monkeypatch.setenv("SLURMD_NODENAME", "node-a")
    monkeypatch.setenv("SATRAIN_HEALTH_DIR", str(out))
    monkeypatch.setenv("SATRAIN_KERNEL_LOG", str(kmsg))
    monkeypatch.setenv("SATRAIN_SCONTROL", "/opt/slurm/bin/scontrol")
    monkeypatch.setenv("SATRAIN_DRAIN_ON_FAULT", "1")
    assert nodecheck.main([]) == 0
    reason = f"nodecheck: Xid 79 on 0000:28:00: {XID}"
    assert calls == [["/opt/slurm/bin/scontrol", "update", "nodename=node-a", "state=drain", f"reason={reason}"]]
    status = json.loads((out / "node-a.status.json").read_text())
    assert status["drained"] == reason and status["problem"] == ""
    assert [r["seq"] for r in lines_of(out)] == [2, 3]  # handed over to the console as well

    monkeypatch.setenv("SATRAIN_DRAIN_ON_FAULT", "0")
    with kmsg.open("a") as fh:
        fh.write(record(4, XID))
    assert nodecheck.main([]) == 0
    assert len(calls) == 1 and "drained" not in json.loads((out / "node-a.status.json").read_text())


def test_a_drain_slurm_refuses_is_said_in_the_nodes_status(tmp_path, scontrol):
    _, answer = scontrol
    answer["rc"] = 1
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    out = tmp_path / "health"
    nodecheck.check("node-a", out, kernel_log=str(kmsg))
    kmsg.write_text(record(1, XID))
    assert nodecheck.check("node-a", out, kernel_log=str(kmsg), scontrol="scontrol") == 1
    assert json.loads((out / "node-a.status.json").read_text())["problem"] == "could not drain the node: slurm_update error: Invalid node state"
