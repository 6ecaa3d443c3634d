"""The one table of NVIDIA Xids and NVSwitch SXids, and the one reader of the kernel lines that carry them
(standard library only).

Every code's facts come from NVIDIA's published Xid catalogue (docs.nvidia.com/deploy/xid-errors,
sheet "Catalog": mnemonic, description, immediate and investigatory resolution), as leptonai/gpud
generated it, with gpud's repair action where the catalogue leaves the resolution empty (Xids 162-173)
and the NVSwitch SXids of NVIDIA's Fabric Manager guide: ``failover/catalog/nvidia.json``, regenerated
by ``python -m failover.catalog.generate``. :data:`XIDS` derives from each code what the product does:

* ``cls``: ``hardware`` (a fault by itself), ``application`` (the run's own, unless ECC / remap evidence
  says otherwise), ``remap`` (63: a fault only when the remap failed), ``recovery`` (154: a fault when
  the new recovery action is not None), ``nvlink5`` (144-150: as the driver prints it, ``Fatal`` or
  ``Nonfatal``) or ``ignore`` (no evidence);
* ``fatal``: the health monitor ends the runs on that GPU at once (RESET_GPU, RESTART_BM, RESTART_VM,
  a printed ``Fatal`` NVLink5 line);
* ``scope``: what the fault takes out of placement: ``gpu`` (a GPU reset fixes it), ``node`` (a reboot,
  the fabric) or ``""`` (nothing: the run is retried elsewhere, the hardware recovered by itself).

A code's row says which rule made it (``source``); :data:`OVERRIDES` lists, with the reason, every code
judged otherwise than its catalogue bucket says. ``docs/failover.md`` shows the table made from this one
(``python -m failover.xids``); a test checks that they agree.

Kernel records count only as the driver writes them (:func:`parse_kernel_line`, the one reader of
kernel text: the health monitor's, the Slurm node check's, the classifier's). The record's message,
after the kmsg header or a text log's timestamp / syslog prefix only (:data:`PREFIX`), must *start*
with the driver's text: ``NVRM: Xid (PCI:…): N,``, ``nvidia-nvswitchN: SXid (PCI:…): N,``, ``NVRM: …``
(fallen off the bus, GPU is lost, GSP timeouts), ``pcieport|nvidia|pci <dev>: … AER …``, ``mlx5_core
…`` / ``mlx5_ib …`` / ``ib_core …`` / an InfiniBand device's ``mlx5_N:`` / ``ibN:``, ``thermal <zone>:``, the OOM
killer's words. The kernel's records of a user process (:data:`USER_RECORD`: ``traps: <comm>[<pid>]
trap invalid opcode … in <file>[…]``, ``<comm>[<pid>]: segfault at … in <file>[…]``, ``general
protection``) name a process and a file the job chose, and are never evidence, whatever driver text
those names spell: a job that runs from a file named ``NVRM: GPU has fallen off the bus`` and traps
makes the kernel print that text after ``traps: python3[pid] … in``, which is no driver's record. An
Xid line's own ``pid=…, name=<comm>`` is the driver's record quoting a process: its code, device and
severity are read where the driver prints them, before the name. Each record is one line
(:func:`one_line`). The kernel-log reader also drops every record not from the kernel's own
facility (``failover.kmsg``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CATALOG_PATH = Path(__file__).parent / "catalog" / "nvidia.json"
CATALOG = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))

# The catalogue's immediate resolutions, and what each means here: (cls, fatal, scope).
BUCKETS: dict[str, tuple[str, bool, str]] = {
    "RESET_GPU": ("hardware", True, "gpu"),
    "RESTART_BM": ("hardware", True, "node"),
    "RESTART_VM": ("hardware", True, "node"),
    "WORKFLOW_XID_48": ("hardware", False, "gpu"),
    "WORKFLOW_NVLINK_ERR": ("hardware", False, "gpu"),
    "WORKFLOW_NVLINK5_ERR": ("nvlink5", False, "gpu"),
    "CHECK_MECHANICALS": ("hardware", False, "gpu"),
    "RESTART_APP": ("application", False, ""),
    "WORKFLOW_XID_45": ("application", False, ""),
    "CHECK_UVM": ("application", False, ""),
    "XID_154": ("recovery", False, "gpu"),
    "IGNORE": ("ignore", False, ""),
    "UPDATE_SWFW": ("ignore", False, ""),
    "CONTACT_SUPPORT": ("ignore", False, ""),  # the catalogue's "Unused" codes
}
# gpud's repair action, for the codes the catalogue leaves without a resolution (162-173).
GPUD_ACTIONS: dict[str, tuple[str, bool, str]] = {
    "RebootSystem": ("hardware", False, "node"),
    "CheckUserAppAndGPU": ("application", False, ""),
}

# code -> (cls, fatal, scope, why). Every departure from the bucket above, with its reason.
OVERRIDES: dict[int, tuple[str, bool, str, str]] = {
    13: ("application", False, "", "catalogue RESTART_APP; an application Xid (k8s-device-plugin skips it)"),
    43: ("application", False, "", "catalogue IGNORE, but it follows a faulting kernel: judged with Xid 13"),
    63: ("remap", False, "gpu", "catalogue IGNORE: a pending remap is the normal outcome; a fault only when the remap failed"),
    79: (
        "hardware",
        True,
        "gpu",
        "catalogue RESTART_BM; the fault is in one GPU: the node's other GPUs stay placeable until an operator drains it for the reboot",
    ),
    94: ("hardware", False, "", "catalogue RESTART_APP: a contained memory error ended the run; the GPU recovered"),
    167: ("hardware", True, "node", "gpud REBOOT_SYSTEM; PCIe fatal timeout: the GPU is gone until a reboot"),
    169: ("hardware", True, "node", "gpud REBOOT_SYSTEM; a micro-controller halt stops the GPU"),
    171: ("hardware", False, "gpu", "an addition to Xid 48 (uncorrectable DRAM error): judged as 48"),
    172: ("hardware", False, "gpu", "an addition to Xid 48 (uncorrectable SRAM error): judged as 48"),
    173: ("hardware", True, "node", "gpud REBOOT_SYSTEM; a fatal C2C link failure (not in the catalogue sheet yet)"),
}
# One line for users, where the catalogue's description says less.
REASONS: dict[int, str] = {
    79: "GPU has fallen off the bus",
    48: "double-bit (uncorrectable) ECC error",
    64: "row-remapping / page-retirement failure",
    95: "uncontained ECC error",
    94: "contained ECC error",
    140: "unrecovered ECC error",
    74: "NVLink error",
    119: "GSP RPC timeout",
    120: "GSP error",
    143: "GPU initialization failure",
    46: "GPU stopped processing",
    62: "internal micro-controller halt",
    110: "security fault error",
    154: "GPU recovery action changed",
    63: "ECC page retirement / row-remapping event",
    13: "graphics engine exception",
    31: "GPU memory page fault (MMU fault)",
    43: "GPU stopped processing the channel (reset channel)",
    45: "preemptive channel removal",
    109: "context-switch timeout",
    121: "C2C link error (corrected)",
}


@dataclass(frozen=True)
class XidRule:
    code: int
    name: str  # the catalogue's mnemonic
    description: str
    immediate: str  # the catalogue's immediate resolution ("" where it gives none)
    investigatory: str
    cls: str  # hardware | application | remap | recovery | nvlink5 | ignore
    fatal: bool  # the monitor ends the runs on the GPU at once
    scope: str  # "gpu" | "node" | "" (what leaves placement)
    reason: str
    source: str  # which rule judged it


def _rule(entry: dict[str, Any]) -> XidRule:
    code = entry["code"]
    immediate = entry["immediate"]
    if code in OVERRIDES:
        cls, fatal, scope, why = OVERRIDES[code]
        source = f"override: {why}"
    elif immediate in BUCKETS:
        cls, fatal, scope = BUCKETS[immediate]
        source = f"catalogue {immediate}"
    else:
        action = next((a for a in entry["gpud_actions"] if a in GPUD_ACTIONS), "")
        cls, fatal, scope = GPUD_ACTIONS.get(action, ("ignore", False, ""))
        source = f"gpud {action}" if action else "no resolution given"
    description = entry["description"] if entry["description"] != "Unused" else ""
    reason = REASONS.get(code) or description or entry["mnemonic"] or f"Xid {code}"
    return XidRule(code, entry["mnemonic"], entry["description"], immediate, entry["investigatory"], cls, fatal, scope, reason, source)


XIDS: dict[int, XidRule] = {entry["code"]: _rule(entry) for entry in CATALOG["xids"]}
FATAL_XIDS = frozenset(code for code, rule in XIDS.items() if rule.fatal)


@dataclass(frozen=True)
class SXidRule:
    code: int
    name: str
    always_fatal: bool  # fatal to the whole fabric (Fabric Manager guide D.6)
    hardware: bool  # a node-side fault by itself (the guide's recovery is a reset / reboot)
    reason: str


SXIDS: dict[int, SXidRule] = {
    entry["code"]: SXidRule(
        entry["code"],
        entry["name"],
        entry["always_fatal"],
        entry["always_fatal"] or "RebootSystem" in entry["gpud_actions"],
        entry["name"] or f"SXid {entry['code']}",
    )
    for entry in CATALOG["sxids"]
}

# --- bus ids -------------------------------------------------------------------------------------


def bus_id(address: str) -> str:
    """``domain:bus:device`` of a PCI address, lower case, domain kept: the kernel's ``0008:01:00``,
    NVML's ``00000008:01:00.0`` and ``PCI:0008:01:00.0`` all become ``0008:01:00``; an address without a
    domain (``3b:00``) is in domain 0000."""
    text = address.strip().lower()
    text = text[4:] if text.startswith("pci:") else text
    parts = text.split(".")[0].split(":")
    domain = parts[-3][-4:] if len(parts) >= 3 else "0000"
    return ":".join([domain.rjust(4, "0"), *parts[-2:]])


# --- kernel lines --------------------------------------------------------------------------------

# What may stand before a record's message in a text log, and nothing else: a continuation line's
# indent, a /dev/kmsg or ``dmesg -r`` priority, dmesg's timestamp ("[ 12.3]", "[  +0.000001]", -T's
# "[Sun Feb 23 16:24:18 2025]"), a syslog or journal "<date> [<host>] kernel:" prefix. Never a
# process's name: a host is a host name's characters only ("traps:" is none).
_DATE = r"(?:[A-Z][a-z]{2} [ \d]\d [\d:]{8}|\d{4}-\d\d-\d\dT[\d:.,]+(?:Z|[+-][\d:]+)?) "
PREFIX = re.compile(
    r"\s*(?:<\d+>)?(?:\[[^\]]*\]\s*)?(?:" + _DATE + r")?(?:(?:[A-Za-z0-9][\w.-]* )?kernel: )?"
    r"(?:\[\s*\d+\.\d+\]\s*)?"
)
_PCI = r"(?:PCI:)?(?P<pci>(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}(?:\.[0-7])?)"
XID_LINE = re.compile(r"NVRM: Xid \(" + _PCI + r"\): (?P<xid>\d+)(?:,\s*(?P<rest>.*))?$")
SXID_LINE = re.compile(r"nvidia-nvswitch\d*: SXid \(" + _PCI + r"\): (?P<sxid>\d+)(?:,\s*(?P<rest>.*))?$")
_NVLINK5_SEVERITY = re.compile(r"^[A-Z0-9_]+(?:/[A-Z0-9_]+)?\s+(?P<severity>Nonfatal|Fatal)\b")
_SXID_SEVERITY = re.compile(r"^(?P<severity>Fatal|Non-fatal)\b")
_CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")
# A user process's record: its name and what it did (x86's ``traps: <comm>[<pid>] trap invalid opcode
# … in <file>[<addr>+<size>]`` and ``… general protection fault …``, ``<comm>[<pid>]: segfault at … in
# <file>[…]``, arm64's ``<comm>[<pid>]: unhandled …``). The process's name and the mapped file's are
# the job's choice: such a record is never evidence, whatever it quotes.
USER_RECORD = re.compile(
    r"^traps: |\[\d+\]: |\[\d+\] (?:trap|general protection)|\bsegfault at\b|\bgeneral protection\b"
    r"|\[[0-9a-fA-F]+\+[0-9a-fA-F]+\]",  # the mapped file's "<name>[<start>+<size>]"
    re.IGNORECASE,
)

# Kernel messages besides Xid lines, each only as its driver writes it: the message *starts* with the
# driver's text (NVRM, pcieport / nvidia / pci with its device, mlx5_core / mlx5_ib / ib_core or the
# InfiniBand device, the thermal core). (name, pattern, reason). Corrected / non-fatal AER messages
# are deliberately not listed.
KERNEL_SIGNATURES: tuple[tuple[str, str, str], ...] = (
    ("fallen_off_bus", r"NVRM: .*fallen off the bus", "GPU has fallen off the bus"),
    ("gpu_lost", r"NVRM: .*\bGPU is lost\b", "GPU is lost"),
    ("pcie_fatal", r"(?:pcieport|nvidia|pci) \S+.*Uncorrect(?:ed|able) \(Fatal\)", "PCIe fatal (uncorrected) error"),
    (
        "network_link_down",
        r"(?:mlx5_core|mlx5_ib|ib_core) \S+ (?P<nic>mlx5_\d+|ibp?\w*)(?::| ).*\blink\s+down\b|"
        r"(?P<nic2>mlx5_\d+|ibp?\w*): .*\bport \d+ .*\b(?:state|link)\b.*\bDOWN\b",
        "InfiniBand link down",
    ),
    ("thermal_shutdown", r"thermal \S+: critical temperature reached.*shutting down|(?:thermal \S+|NVRM): .*\bthermal shutdown\b", "thermal shutdown"),
    (
        "gsp_timeout",
        r"NVRM: .*(?:Timeout waiting for RPC from GSP|\bGSP\b.*\bheartbeat\b.*(?:timeout|timed out|missed)|"
        r"\bGSP (?:RPC )?Timeout\b)",
        "GSP firmware not responding (RPC / heartbeat timeout)",
    ),
)
_SIGNATURES = [(name, re.compile(r"(?:" + pattern + ")", re.IGNORECASE), reason) for name, pattern, reason in KERNEL_SIGNATURES]
FATAL_KERNEL = frozenset({"fallen_off_bus", "gpu_lost"})
OOM_KILL = re.compile(r"(?:Out of memory: Kill(?:ed)? process|\S+ invoked oom-killer|oom-kill:|oom_reaper)")
PCIE_UNCORRECTABLE = re.compile(r"(?:pcieport|nvidia|pci) \S+.*Uncorrect(?:ed|able)", re.IGNORECASE)
_BREAKS = re.compile(r"[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")


def one_line(text: str) -> str:
    """One record's text on one line: a line break inside it escaped as ``/dev/kmsg`` escapes it
    (``\\x0a``), so no part of a record is ever read as a record of its own."""
    return _BREAKS.sub(lambda found: f"\\x{ord(found[0]):02x}", text.strip("\r\n"))


def kernel_message(text: str) -> str:
    """A record's message: its text (one line, :func:`one_line`) less the text log's prefix
    (:data:`PREFIX`: a timestamp, a priority, a syslog prefix) and nothing more."""
    line = one_line(text)
    found = PREFIX.match(line)
    return line[found.end() :] if found else line


@dataclass(frozen=True)
class KernelEvent:
    """One kernel line the product knows, as the driver wrote it."""

    kind: str  # "xid" | "sxid" | a KERNEL_SIGNATURES name | "pcie_uncorrectable" | "oom_kill"
    text: str
    code: int | None = None  # the Xid or SXid
    pci: str = ""  # bus_id() of the device the line names ("" where none)
    severity: str = ""  # "Fatal" / "Nonfatal" / "Non-fatal" as printed
    cause: int | None = None  # "caused by previous Xid N"
    nic: str = ""

    @property
    def fatal(self) -> bool:
        """Whether it ends the runs on its GPU (or node) at once."""
        if self.kind == "xid":
            return xid_fatal(self.code, self.severity) or (self.cause is not None and xid_fatal(self.cause, ""))
        if self.kind == "sxid":
            return self.severity == "Fatal" or bool(self.code in SXIDS and SXIDS[self.code].always_fatal)
        return self.kind in FATAL_KERNEL


def xid_fatal(code: int | None, severity: str) -> bool:
    rule = XIDS.get(code) if code is not None else None
    if rule is None:
        return False
    if rule.cls == "nvlink5":
        return severity == "Fatal"
    return rule.fatal


def parse_kernel_line(text: str) -> KernelEvent | None:
    """The event one kernel record carries, or None: the one reader of kernel text (the health
    monitor's, the Slurm node check's, the classifier's).

    The record's message (:func:`kernel_message`: after the kmsg header, dmesg's timestamp or a
    syslog prefix only) must *start* with its driver's text: ``NVRM: Xid (PCI:…): N, …``,
    ``nvidia-nvswitchN: SXid (PCI:…): N, …``, then the hardware messages of :data:`KERNEL_SIGNATURES`,
    PCIe uncorrectable errors and the OOM killer. A user process's record (:data:`USER_RECORD`: ``traps:``,
    ``segfault``, ``general protection``, ``<comm>[<pid>]``, ``in <file>[…]``) is never one, whatever
    driver text its process or file name spells. An Xid's or SXid's code, device and severity are read
    where the driver prints them, before the ``pid=…, name=…`` it may quote."""
    line = one_line(text)
    message, line = kernel_message(line), line.strip()
    match = XID_LINE.match(message)
    if match:
        rest = match["rest"] or ""
        severity = _NVLINK5_SEVERITY.match(rest)  # where the driver prints it: before any pid= / name=
        cause = _CAUSED_BY.search(rest)  # a quoted name (a comm: 15 bytes at most) cannot spell it
        return KernelEvent("xid", line, int(match["xid"]), bus_id(match["pci"]), severity["severity"] if severity else "", int(cause[1]) if cause else None)
    match = SXID_LINE.match(message)
    if match:
        severity = _SXID_SEVERITY.match(match["rest"] or "")
        return KernelEvent("sxid", line, int(match["sxid"]), bus_id(match["pci"]), severity["severity"] if severity else "")
    if USER_RECORD.search(message):
        return None  # a process's name, a file's, and what the process did: whatever they are called
    for name, regex, _reason in _SIGNATURES:
        found = regex.match(message)
        if found:
            nic = (found.groupdict().get("nic") or found.groupdict().get("nic2") or "") if name == "network_link_down" else ""
            return KernelEvent(name, line, nic=nic)
    if PCIE_UNCORRECTABLE.match(message):
        return KernelEvent("pcie_uncorrectable", line)
    if OOM_KILL.match(message):
        return KernelEvent("oom_kill", line)
    return None


# --- the table for the docs ------------------------------------------------------------------------


def markdown_table() -> str:
    """The Xid rows a judgement reads (every code not ``ignore``), then the SXid rule: ``docs/failover.md``."""
    rows = ["| Xid | name | catalogue: immediate / investigatory | class | fatal for the run | scope | source |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for rule in XIDS.values():
        if rule.cls == "ignore":
            continue
        actions = f"{rule.immediate or '—'} / {rule.investigatory or '—'}"
        fatal = "as printed (`Fatal`)" if rule.cls == "nvlink5" else ("yes" if rule.fatal else "no")
        rows.append(f"| {rule.code} | {rule.name or rule.description} | {actions} | {rule.cls} | {fatal} | {rule.scope or '—'} | {rule.source} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_table())
