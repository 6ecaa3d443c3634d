"""The health check a cluster runs on each of its nodes (Slurm's ``HealthCheckProgram``): the
node's own kernel log, read where the last check stopped, its fault lines handed to the console.

Slurm runs it as root on every node each ``HealthCheckInterval`` seconds, with only
``SLURMD_NODENAME`` in its environment; the cluster's wrapper script sets the rest
(``SATRAIN_HEALTH_DIR``, and ``SATRAIN_KERNEL_LOG`` where the kernel log is not ``/dev/kmsg``).
One pass:

* reads the kernel log (``failover.kmsg``: the kernel's own NVRM Xid / SXid, fallen-off-the-bus,
  PCIe AER, link-down, thermal … lines, each only as its driver writes it, the message *starting*
  with the driver's text; a job's trap or segfault record, ``traps: <comm>[<pid>] … in <file>[…]``,
  is never handed over, whatever its names spell) after the sequence number the last pass kept in
  ``<node>.cursor``; on the first pass, only lines of the last ``FIRST_PASS_WINDOW`` seconds;
* appends each as one JSON record ``{"seq", "at", "text"}`` to ``<node>.jsonl``;
* writes ``<node>.status.json``: when it ran, why the kernel log could not be read (if so), and
  the node's GPU index by PCI bus id where NVML answers (so an Xid line names its GPU);
* where the site asks for it (``SATRAIN_DRAIN_ON_FAULT=1``), drains its own node on a fatal
  record (``KernelEvent.fatal``: a GPU that fell off the bus, an Xid whose fix is a reset or a
  reboot, …): ``scontrol update nodename=<node> state=drain reason="nodecheck: Xid 79 …"``, so
  Slurm stops placing work there even while the console is down. The console's Mark healthy
  returns only its own ``console:`` drains: a ``nodecheck:`` drain is the operator's to resume.

It judges nothing else: the console's health monitor reads these files
(``failover.services.monitor.NodeEvidenceMonitor``, which parses each line again with the same
``failover.xids.parse_kernel_line``, from where the last console stopped), and its one verdict
drains the node in Slurm with the fault's reason. Standard library only (``pynvml`` where
installed): no Django, no database. The directory is the cluster's (root's), never a job's; paths are opened without
following links.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from failover.kmsg import KMSG_PATH, KernelLine, KernelLogReader
from failover.xids import parse_kernel_line
from jobs.backends.facts import NodeCheckFiles

FIRST_PASS_WINDOW = 60.0
RECORD_MAX_TEXT = 500
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
DRAIN_PREFIX = "nodecheck:"


def evidence_paths(directory: Path, node: str) -> dict[str, Path]:
    """The node's files in the evidence directory (shared by the console and the nodes)."""
    return NodeCheckFiles(directory).paths(node)


def _write_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(payload))
    os.replace(temporary, path)


def read_json_file(path: Path, limit: int = 64 * 1024) -> dict[str, Any] | None:
    """A JSON object from a file (not through a link, at most ``limit`` bytes), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd) as fh:
            value = json.loads(fh.read(limit))
    except (OSError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _read_cursor(path: Path) -> int | None:
    value = (read_json_file(path) or {}).get("seq")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def gpus_by_pci(node: str) -> dict[str, int]:
    """GPU index by PCI bus id from NVML, or {} where there is no driver (or no pynvml)."""
    try:
        from failover.nvml import NvmlProbe

        probe = NvmlProbe(node, expected_gpus=0)
    except Exception:  # no NVML here: Xid lines then name no GPU
        return {}
    try:
        return probe.gpu_by_pci()
    finally:
        probe.close()


def fault_reason(lines: list[KernelLine]) -> str | None:
    """Slurm's drain reason for the first fatal record among ``lines`` (None: none is)."""
    for line in lines:
        event = parse_kernel_line(line.text)
        if event is not None and event.fatal:
            name = {"xid": "Xid", "sxid": "SXid"}.get(event.kind, event.kind)
            what = f"{name} {event.code}" if event.code is not None else name
            where = f" on {event.pci}" if event.pci else ""
            return " ".join(f"{DRAIN_PREFIX} {what}{where}: {line.text}".split())[:250]
    return None


def drain(node: str, reason: str, *, scontrol: str = "scontrol") -> str:
    """Drain the node in Slurm; returns why it could not ("" when it did)."""
    command = [scontrol, "update", f"nodename={node}", "state=drain", f"reason={reason}"]
    try:
        result = subprocess.run(command, check=False, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        return f"could not drain the node: {error}"
    if result.returncode != 0:
        return f"could not drain the node: {(result.stderr or result.stdout).strip()[:200] or f'exit {result.returncode}'}"
    return ""


def check(node: str, directory: Path, *, kernel_log: str = KMSG_PATH, now: float | None = None, scontrol: str | None = None) -> int:
    """One pass for ``node``; returns how many lines it handed over. ``scontrol``: drain the node
    with it on a fatal record (None: drain nothing)."""
    if not NODE_NAME.match(node):
        raise ValueError(f"not a node name: {node!r}")
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    paths = evidence_paths(directory, node)
    now = time.time() if now is None else now
    cursor = _read_cursor(paths["cursor"])
    reader = KernelLogReader(kernel_log, fallbacks=False)
    reader.seq = cursor
    try:
        lines = reader.read()
    finally:
        reader.close()
    if cursor is None:  # the first pass: the ring's old lines are not news
        lines = [line for line in lines if line.at >= now - FIRST_PASS_WINDOW]
    if lines:
        fd = os.open(paths["lines"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "a") as fh:
            for line in lines:
                fh.write(json.dumps({"seq": line.seq, "at": line.at, "text": line.text[:RECORD_MAX_TEXT]}) + "\n")
    if reader.seq is not None and reader.seq != cursor:
        _write_atomic(paths["cursor"], {"seq": reader.seq})
    # NVML is asked once, then again only when a pass has lines to attribute.
    known = (read_json_file(paths["status"]) or {}).get("gpus_by_pci")
    pci = gpus_by_pci(node) if lines or not isinstance(known, dict) else known
    status: dict[str, Any] = {"checked_at": now, "problem": reader.problem, "gpus_by_pci": pci}
    reason = fault_reason(lines) if scontrol else None
    if scontrol and reason:  # after the lines are handed over: the console reads why
        status["drained"] = reason
        failed = drain(node, reason, scontrol=scontrol)
        if failed:
            status["problem"] = "; ".join(filter(None, [reader.problem, failed]))
    _write_atomic(paths["status"], status)
    return len(lines)


def main(argv: list[str] | None = None) -> int:
    node = os.environ.get("SLURMD_NODENAME", "")
    directory = os.environ.get("SATRAIN_HEALTH_DIR", "")
    if not node or not directory:
        print("nodecheck: SLURMD_NODENAME and SATRAIN_HEALTH_DIR must be set", file=sys.stderr)
        return 2
    try:
        scontrol = (os.environ.get("SATRAIN_SCONTROL") or "scontrol") if os.environ.get("SATRAIN_DRAIN_ON_FAULT") == "1" else None
        check(node, Path(directory), kernel_log=os.environ.get("SATRAIN_KERNEL_LOG") or KMSG_PATH, scontrol=scontrol)
    except (OSError, ValueError) as error:
        print(f"nodecheck: {node}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
