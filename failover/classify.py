"""Failure classification for Job Failover: hardware fault or not, and why.

A pure function (stdlib only, no Django) from the way a run stopped (exit code or signal), the
node's health evidence (NVML findings and the kernel log's ``NVRM: Xid`` lines) and the run's last
log lines to a :class:`Verdict`.

The rule: fail over only on *evidence* of a hardware fault. Evidence is a node-side reading (an
NVML finding, a kernel-log Xid or kernel hardware message) or an unambiguous hardware signature in
the run's own output ("uncorrectable ECC error encountered", "GPU is lost", "fallen off the bus").
A bare mention of a component ("Using NVLink for all-reduce", "ECC mode enabled", an ``nvidia-smi``
table) is not evidence, and neither is a user's own exception that merely quotes hardware words.

Kernel text (``kernel_log``) is read by one parser, ``failover.xids.parse_kernel_line``: a record counts
only when its message starts with the driver's text (``NVRM: Xid …``, ``nvidia-nvswitchN: SXid …``,
``pcieport <dev>: AER: …``, ``mlx5_core …``); a user process's record (``traps: <comm>[<pid>] … in
<file>[…]``, ``<comm>[<pid>]: segfault at …``, ``general protection``) is no evidence of anything,
whatever its process or file name spells, and of the other kernel records only the OOM killer's may
give a non-hardware reason (the host OOM kill). The run's own log lines are another matter: they may
explain this run's own verdict (step 2), never mark a node.

Precedence:

1. node-side evidence: NVML findings and kernel-log Xids / hardware messages, judged by
   :data:`XID_RULES`, :data:`FINDING_RULES` and :data:`KERNEL_SIGNATURES`; when several apply, the
   one listed first in :data:`HARDWARE_PRIORITY` is reported;
2. hardware signatures in the run's own last log lines (:data:`LOG_HARDWARE_SIGNATURES`);
3. ambiguous failures (an application-class Xid, an illegal memory access, a bare NCCL timeout)
   become hardware only when the node also shows supporting evidence (:data:`SUPPORTING_KINDS`);
4. otherwise non-hardware, with the most specific reason found (:data:`NON_HARDWARE_SIGNATURES`,
   then the exit signal, then the exit code).

The tables are data and are mirrored for users in ``docs/failover.md`` ("How a failure is judged" and the tables after it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from failover.evidence import Finding, FindingKind
from failover.exits import exit_status_facts
from failover.logscan import (  # noqa: F401  (the tables are part of this module's interface)
    _EXCEPTION_LINE,
    LOG_HARDWARE_SIGNATURES,
    NON_HARDWARE_SIGNATURES,
    RUNTIME_PREFIX,
    _first_log_hardware_signature,
    _most_specific_internal_error,
    _trim,
)
from failover.xids import KERNEL_SIGNATURES, SXIDS, XIDS, bus_id, kernel_message, parse_kernel_line

KERNEL_REASONS = {name: reason for name, _pattern, reason in KERNEL_SIGNATURES}
# NVRx's rule for NVLink counters: growing in this many of the last NVLINK_WINDOWS readings is a fault.
NVLINK_GROWTH_WINDOWS = 16
NVLINK_WINDOWS = 30
# Xids that follow an application Xid on the same GPU as its consequence, not a fault of their own:
# a context-switch timeout (109) after the application's kernel faulted (Xid 13 / 31 / 43).
FOLLOWS_APPLICATION = frozenset({109})

HARDWARE = "hardware"
NON_HARDWARE = "non-hardware"

# --- Table 1: Xid codes -------------------------------------------------------------------------
# One table, ``failover.xids.XIDS``, derived from NVIDIA's Xid catalogue (with SXids: ``SXIDS``); the
# health monitor, this classifier and docs/failover.md read it. Its classes: "hardware" (a fault by
# itself), "application" (hardware only with ECC or remap evidence), "remap" (Xid 63: hardware only
# with a failed remap), "recovery" (Xid 154: hardware unless the new action is None), "nvlink5"
# (144-150: hardware when the driver printed "Fatal"; a Nonfatal line is no evidence; an NVML event,
# without its text, supports an ambiguous failure) and "ignore".

# --- Table 2: NVML finding kinds ----------------------------------------------------------------
# (kind, class, reason). "hardware": a fault by itself (subject to the value checks in
# _judge_finding); "supporting": not a fault alone, but upgrades an ambiguous failure.
FINDING_RULES: tuple[tuple[str, str, str], ...] = (
    (FindingKind.GPU_LOST, "hardware", "GPU is lost"),
    (FindingKind.RESET_REQUIRED, "hardware", "GPU requires a reset"),
    (FindingKind.GPU_COUNT, "hardware", "fewer GPUs visible than expected"),
    (FindingKind.ECC_UNCORRECTED, "hardware", "uncorrected ECC errors"),
    (FindingKind.REMAP_FAILURE, "hardware", "row-remapping failure"),
    (FindingKind.NVLINK_DOWN, "hardware", "NVLink link down"),
    (FindingKind.NETWORK_LINK, "hardware", "InfiniBand / RoCE port down"),
    (FindingKind.THERMAL, "hardware", "hardware thermal slowdown / shutdown"),
    (FindingKind.RECOVERY_ACTION, "hardware", "driver recovery action pending"),
    (FindingKind.XID, "xid", "Xid event (judged by the Xid table)"),
    (FindingKind.REMAP_PENDING, "supporting", "row remapping pending"),
    (FindingKind.RETIRED_PAGES_PENDING, "supporting", "page retirement pending"),
    (FindingKind.PCIE_REPLAY, "supporting", "PCIe replay counter grew"),
    (FindingKind.PCIE_LINK_DEGRADED, "supporting", "PCIe link degraded"),
    (FindingKind.NVLINK_ERRORS, "supporting", "NVLink error counters grew"),
    # A hung NVML call says the driver is wedged, not which part failed: it upgrades an ambiguous
    # failure but does not take a node down by itself.
    (FindingKind.DRIVER_ERROR, "supporting", "NVML driver call hung or failed"),
)
FINDING_BY_KIND: dict[str, tuple[str, str]] = {kind: (cls, reason) for kind, cls, reason in FINDING_RULES}
SUPPORTING_KINDS = frozenset(kind for kind, cls, _ in FINDING_RULES if cls == "supporting")
# NVML's nvmlGpuRecoveryAction_t values (0 is NONE).
# 5–7 arrived with newer drivers (nvidia-ml-py's NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN,
# _BUS_RESET, _SYSTEM_REBOOT).
RECOVERY_ACTIONS = {
    1: "GPU reset required",
    2: "node reboot required",
    3: "drain P2P",
    4: "drain and reset",
    5: "recover the IMEX domain",
    6: "bus reset required",
    7: "system reboot required",
}
# Findings whose fault is the node's, not one GPU's (the fabric, the host's NIC, a GPU gone missing),
# and the recovery actions that reboot the node or recover its IMEX domain.
NODE_KINDS = frozenset({FindingKind.GPU_COUNT, FindingKind.NETWORK_LINK})
NODE_RECOVERY = frozenset({2, 5, 7})
# Kinds whose probe detail says something the reason does not (which port, which condition).
DETAIL_IN_REASON = frozenset({FindingKind.THERMAL, FindingKind.NETWORK_LINK})
REMAP_EVIDENCE_KINDS = frozenset({FindingKind.REMAP_PENDING, FindingKind.REMAP_FAILURE, FindingKind.RETIRED_PAGES_PENDING})
# What makes Xid 63 a fault: the remap failed (NVRx / gpud: a failed remap needs the GPU replaced).
REMAP_FAILED_KINDS = frozenset({FindingKind.REMAP_FAILURE})

# --- Table 3: kernel-log hardware messages (besides Xid lines): ``failover.xids.KERNEL_SIGNATURES``,
# each matched only in the words its driver writes (``failover.xids.parse_kernel_line``).

# The order in which hardware evidence is reported when several kinds apply (first wins); the
# table's other hardware Xids follow, then SXids (``sxid:N``).
_HEAD: tuple[str, ...] = (
    "xid:79",
    "finding:gpu_lost",
    "kernel:fallen_off_bus",
    "kernel:gpu_lost",
    "xid:48",
    "xid:95",
    "xid:94",
    "xid:140",
    "finding:ecc_uncorrected",
    "xid:64",
    "finding:remap_failure",
    "xid:63",
    "kernel:pcie_fatal",
    "xid:74",
    "xid:144",
    "xid:145",
    "xid:146",
    "xid:147",
    "xid:148",
    "xid:149",
    "xid:150",
    "finding:nvlink_down",
    "finding:nvlink_errors",
    "finding:network_link",
    "kernel:network_link_down",
    "xid:62",
    "xid:110",
    "xid:136",
    "xid:155",
    "xid:156",
    "xid:158",
    "xid:167",
    "xid:169",
    "xid:119",
    "xid:120",
    "kernel:gsp_timeout",
    "xid:143",
    "xid:46",
    "xid:109",
    "xid:154",
    "finding:recovery_action",
    "finding:reset_required",
    "finding:gpu_count",
    "finding:thermal",
    "kernel:thermal_shutdown",
)
HARDWARE_PRIORITY: tuple[str, ...] = (
    _HEAD + tuple(f"xid:{code}" for code, rule in XIDS.items() if rule.cls != "ignore" and f"xid:{code}" not in _HEAD) + ("sxid",)
)
_PRIORITY_RANK = {key: rank for rank, key in enumerate(HARDWARE_PRIORITY)}

_CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")
_RECOVERY_TARGET = re.compile(r"recovery action changed from .*? to (?:0x[0-9A-Fa-f]+ )?\(([^)]*)\)")


@dataclass(frozen=True)
class Verdict:
    """The classifier's judgement of one stopped run."""

    hardware: bool
    reason: str  # one line for users, e.g. "Xid 79 on GPU 2: GPU has fallen off the bus"
    evidence: dict[str, Any] = field(default_factory=dict)  # JSON-serialisable

    @property
    def verdict(self) -> str:
        return HARDWARE if self.hardware else NON_HARDWARE

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reason": self.reason, "evidence": self.evidence}


@dataclass(frozen=True)
class _Candidate:
    """One piece of hardware evidence, before the most important one is picked."""

    key: str  # "xid:79", "finding:gpu_lost", "kernel:pcie_fatal", "sxid:20034"
    reason: str
    evidence: dict[str, Any]
    scope: str = "node"  # what the fault takes out of placement: "gpu", "node" or "" (nothing)

    @property
    def rank(self) -> int:
        return _PRIORITY_RANK.get(self.key.split(":")[0] if self.key.startswith("sxid:") else self.key, len(_PRIORITY_RANK))


@dataclass(frozen=True)
class NodeFault:
    """What a node's own evidence says is broken: the GPUs to mark, whether the whole node."""

    reason: str
    gpus: frozenset[int]
    node: bool
    reasons: Mapping[int | None, str] = field(default_factory=dict)  # each GPU's own first-ranked reason; None: the node's


pci_key = bus_id  # the PCI address with its domain: "0008:01:00" (failover.xids.bus_id)


def parse_kernel_xids(kernel_log: str, gpu_by_pci: Mapping[str, int] | None = None) -> list[Finding]:
    """Xid and SXid findings from kernel-log text (``dmesg`` / ``journalctl -k``), read by
    ``failover.xids.parse_kernel_line``: only lines as the driver writes them.

    ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`` becomes
    ``Finding(kind="xid", xid=79, detail="NVRM: Xid (PCI:0000:3b:00): 79, ...")``; an NVSwitch
    ``SXid (PCI:…): 20034, Fatal, …`` line a ``Finding(kind="sxid", xid=20034)`` (node-wide). A line
    saying "caused by previous Xid 149" also yields a finding for Xid 149, which the driver names as
    the root cause. ``gpu`` is the index ``gpu_by_pci`` (keys from :func:`bus_id`, domain kept) gives
    the line's PCI address; None where it is not known.
    """
    findings: list[Finding] = []
    for line in (kernel_log or "").splitlines():
        event = parse_kernel_line(line)
        if event is None or event.kind not in ("xid", "sxid"):
            continue
        detail = _trim(kernel_message(line))
        if event.kind == "sxid":
            findings.append(Finding(kind=FindingKind.SXID, xid=event.code, detail=detail))
            continue
        gpu = (gpu_by_pci or {}).get(event.pci)
        findings.append(Finding(kind=FindingKind.XID, gpu=gpu, xid=event.code, detail=detail))
        if event.cause is not None:
            findings.append(Finding(kind=FindingKind.XID, gpu=gpu, xid=event.cause, detail=f"(named as cause) {detail}"))
    return findings


def classify_failure(
    *,
    exit_code: int | None = None,
    exit_signal: int | None = None,
    findings: Sequence[Finding] = (),
    kernel_log: str = "",
    log_lines: Sequence[str] = (),
    kernel_findings: Sequence[Finding] = (),
) -> Verdict:
    """Judge one stopped run: hardware fault (fail over) or not (refuse), with the reason.

    Args:
        exit_code: the process's exit status; negative means killed by that signal (Popen style),
            128+N the shell's way of saying the same.
        exit_signal: the signal that killed the process, when known separately.
        findings: the node's health findings (NVML or simulated probe), taken as node-side evidence.
        kernel_log: the node's recent kernel log; ``NVRM: Xid`` lines and kernel hardware
            messages in it are node-side evidence.
        log_lines: the run's last log lines.
        kernel_findings: Xid findings already read from the kernel log (their lines are not in
            ``kernel_log``), reported with the kernel log as their source.

    Returns:
        A :class:`Verdict`.
    """
    if isinstance(log_lines, str):
        log_lines = log_lines.splitlines()
    exit_facts = exit_status_facts(exit_code, exit_signal)
    nvml_findings = list(findings)
    kernel_findings = list(kernel_findings) + parse_kernel_xids(kernel_log)
    kernel_lines = (kernel_log or "").splitlines()
    node_findings = [(f, "nvml") for f in nvml_findings] + [(f, "kernel_log") for f in kernel_findings]

    # 1. Node-side evidence.
    candidates, application_xids, unconfirmed_xids, supporting = _node_evidence(node_findings, kernel_lines)
    if candidates:
        return _hardware(min(candidates, key=lambda c: c.rank), exit_facts, supporting)

    # 2. Unambiguous hardware signatures in the run's own output.
    log_hit = _first_log_hardware_signature(log_lines)
    if log_hit is not None:
        name, reason, line = log_hit
        evidence: dict[str, object] = {"source": "log", "signature": name, "matched": line}
        return _hardware(_Candidate(f"log:{name}", f"run log: {reason}", evidence), exit_facts, supporting)

    # 3. Ambiguous failures with supporting node evidence.
    non_hw = _most_specific_internal_error(log_lines, _oom_killer_records(kernel_lines))
    if supporting:
        support_text = _describe_support(supporting)
        # An application Xid is the run's own unless the memory says otherwise (a remap pending or
        # failed, a page retirement): a PCIe replay or NVLink counter beside Xid 13 proves nothing.
        if application_xids and any(f.kind in REMAP_EVIDENCE_KINDS for f, _ in supporting):
            finding, source = application_xids[0]
            xid_reason = _xid_reason(finding)
            evidence = {"source": source, "xid": finding.xid, "matched": finding.detail or None, "gpu": finding.gpu}
            reason = f"{_xid_label(finding)}: {xid_reason}, with node evidence: {support_text}"
            return _hardware(_Candidate(f"xid:{finding.xid}", reason, evidence), exit_facts, supporting)
        if non_hw is not None and non_hw[3]:
            name, reason, line, _ = non_hw
            evidence = {"source": "log", "signature": name, "matched": line}
            return _hardware(_Candidate(f"log:{name}", f"{reason} with node evidence: {support_text}", evidence), exit_facts, supporting)

    # 4. Non-hardware, with the most specific reason found.
    evidence = {}
    if non_hw is not None:
        name, reason, line, ambiguous = non_hw
        if ambiguous:
            reason = f"{reason} (no node evidence of a hardware fault)"
        evidence = {"source": "log", "signature": name, "matched": line}
    elif application_xids:
        finding, source = application_xids[0]
        reason = f"{_xid_label(finding)}: {_xid_reason(finding)} (application-class, no ECC or remap evidence)"
        evidence = {"source": source, "xid": finding.xid, "gpu": finding.gpu, "matched": finding.detail or None}
    elif unconfirmed_xids:
        finding, source = unconfirmed_xids[0]
        reason = f"{_xid_label(finding)}: {_xid_reason(finding)} (no failed remap reading)"
        evidence = {"source": source, "xid": finding.xid, "gpu": finding.gpu, "matched": finding.detail or None}
    elif exit_facts.get("reason"):
        reason = exit_facts["reason"]
        evidence = {"source": "exit"}
    else:
        reason = "no hardware fault signal"
        evidence = {"source": "none"}
    return Verdict(hardware=False, reason=reason, evidence=_clean(evidence, exit_facts, supporting))


def _node_evidence(
    node_findings: Sequence[tuple[Finding, str]], kernel_lines: Sequence[str]
) -> tuple[list[_Candidate], list[tuple[Finding, str]], list[tuple[Finding, str]], list[tuple[Finding, str]]]:
    """Step 1: the hardware candidates of the node's own evidence, the application-class Xids,
    the Xid 63s without a failed remap, and the supporting readings."""
    supporting = [(f, src) for f, src in node_findings if f.kind in SUPPORTING_KINDS]
    xids_present = {f.xid for f, _ in node_findings if f.kind == FindingKind.XID and f.xid is not None}
    has_remap_failure = any(f.kind in REMAP_FAILED_KINDS for f, _ in node_findings) or 64 in xids_present
    candidates: list[_Candidate] = []
    application_xids: list[tuple[Finding, str]] = []
    unconfirmed_xids: list[tuple[Finding, str]] = []  # Xid 63 without remap evidence
    app_gpus = {_xid_where(f) for f, _ in node_findings if f.kind == FindingKind.XID and f.xid in XIDS and XIDS[f.xid].cls == "application"}
    for finding, source in node_findings:
        if finding.kind == FindingKind.XID:
            judged = _judge_xid(finding, source, has_remap_failure)
            if finding.xid in FOLLOWS_APPLICATION and _xid_where(finding) in app_gpus:
                judged = "application"  # the timeout of the application's own faulting kernel
            if judged == "application":
                application_xids.append((finding, source))
            elif judged == "unconfirmed":
                unconfirmed_xids.append((finding, source))
            elif judged == "supporting":
                supporting.append((finding, source))
            elif isinstance(judged, _Candidate):
                candidates.append(judged)
        elif finding.kind == FindingKind.SXID:
            judged = _judge_sxid(finding, source)
            if judged is not None:
                candidates.append(judged)
        else:
            judged = _judge_finding(finding, source)
            if judged is not None:
                candidates.append(judged)
    candidates.extend(_kernel_signature_candidates(kernel_lines))
    candidates.extend(_nvlink_growth_candidates([f for f, _ in node_findings]))
    return candidates, application_xids, unconfirmed_xids, supporting


def _xid_where(finding: Finding) -> tuple[int | None, str]:
    """The GPU an Xid is on: its index, else the bus id its line names."""
    event = parse_kernel_line(finding.detail) if finding.gpu is None and finding.detail else None
    return (finding.gpu, event.pci if event is not None else "")


def node_fault(findings: Sequence[Finding] = (), kernel_findings: Sequence[Finding] = (), kernel_log: str = "") -> NodeFault | None:
    """What the node's own evidence (no run, no log) says is broken, or None: the health writer's
    judgement. Only evidence that is a fault by itself counts (never an ambiguous failure upgraded by
    supporting readings); each fault marks its GPU where the table scopes it to one GPU, else the node."""
    node_findings = [(f, "nvml") for f in findings] + [(f, "kernel_log") for f in kernel_findings]
    node_findings += [(f, "kernel_log") for f in parse_kernel_xids(kernel_log)]
    candidates = [c for c in _node_evidence(node_findings, (kernel_log or "").splitlines())[0] if c.scope]
    if not candidates:
        return None
    gpus = frozenset(c.evidence["gpu"] for c in candidates if c.scope == "gpu" and c.evidence.get("gpu") is not None)
    node = any(c.scope == "node" or c.evidence.get("gpu") is None for c in candidates)
    reasons: dict[int | None, str] = {}
    for c in sorted(candidates, key=lambda c: c.rank):
        target = c.evidence.get("gpu") if c.scope == "gpu" else None
        reasons.setdefault(target, c.reason)
    return NodeFault(min(candidates, key=lambda c: c.rank).reason, gpus, node, reasons)


def _nvlink_growth_candidates(findings: Sequence[Finding]) -> list[_Candidate]:
    """NVLink error counters that grew in NVLINK_GROWTH_WINDOWS of the last NVLINK_WINDOWS readings
    (NVRx's threshold): one finding per reading that grew, or one with ``value`` windows of ``expected``."""
    grown: dict[int | None, int] = {}
    for finding in findings:
        if finding.kind != FindingKind.NVLINK_ERRORS:
            continue
        windows = finding.value if finding.expected is not None and finding.value is not None else 1
        grown[finding.gpu] = grown.get(finding.gpu, 0) + windows
    out = []
    for gpu, windows in grown.items():
        if windows >= NVLINK_GROWTH_WINDOWS:
            where = f" on GPU {gpu}" if gpu is not None else ""
            reason = f"NVLink error counters grew in {windows} readings{where} (threshold {NVLINK_GROWTH_WINDOWS} of {NVLINK_WINDOWS})"
            out.append(_Candidate("finding:nvlink_errors", reason, {"source": "nvml", "kind": FindingKind.NVLINK_ERRORS, "gpu": gpu, "value": windows}, "gpu"))
    return out


# --- judging node-side findings ------------------------------------------------------------------


def _xid_reason(finding: Finding) -> str:
    """The table's reason for the finding's Xid (one the table knows: it was judged)."""
    rule = XIDS.get(finding.xid) if finding.xid is not None else None
    return rule.reason if rule is not None else ""


def _judge_xid(finding: Finding, source: str, has_remap_failure: bool) -> _Candidate | str | None:
    """A hardware candidate; "application" for an application-class Xid; "unconfirmed" for Xid 63
    without a failed remap; "supporting" for an NVLink5 Xid whose severity is not known (an NVML
    event); None for an Xid that is no evidence at all."""
    rule = XIDS.get(finding.xid) if finding.xid is not None else None
    if rule is None or rule.cls == "ignore":
        return None
    cls, reason, scope = rule.cls, rule.reason, rule.scope
    if cls == "application":
        return "application"
    if cls == "remap" and not has_remap_failure:
        return "unconfirmed"
    if cls == "nvlink5":
        event = parse_kernel_line(finding.detail.removeprefix("(named as cause) ")) if finding.detail else None
        severity = event.severity if event is not None and event.kind == "xid" else ""
        if finding.detail.startswith("(named as cause) "):
            severity = "Fatal"  # the driver tore a channel down for it: not a benign link event
        if not severity:
            return "supporting"
        if severity != "Fatal":
            return None  # the driver printed Nonfatal: the catalogue's decode says IGNORE
        reason = f"{reason} (Fatal)"
    if cls == "recovery":
        target = _RECOVERY_TARGET.search(finding.detail or "")
        if target and target[1].strip().lower() == "none":
            return None
        if target:
            reason = f"{reason} to {target[1].strip()}"
            if re.search(r"(?i)reboot|node", target[1]):
                scope = "node"
    if cls == "remap":
        reason = f"{reason} with a failed remap"
    evidence = {"source": source, "xid": finding.xid, "gpu": finding.gpu, "matched": finding.detail or None}
    return _Candidate(f"xid:{finding.xid}", f"{_xid_label(finding)}: {reason}", evidence, scope)


def _judge_sxid(finding: Finding, source: str) -> _Candidate | None:
    """An NVSwitch SXid: a fabric fault (node-wide) when the driver printed Fatal, or the Fabric
    Manager guide's recovery for it is a reset / reboot."""
    rule = SXIDS.get(finding.xid) if finding.xid is not None else None
    event = parse_kernel_line(finding.detail) if finding.detail else None
    fatal = event is not None and event.severity == "Fatal"
    if not fatal and (rule is None or not rule.hardware):
        return None
    name = rule.reason if rule is not None else "NVSwitch error"
    severity = event.severity if event is not None and event.severity else ("Fatal" if fatal else "")
    reason = f"SXid {finding.xid} on NVSwitch{' PCI ' + event.pci if event is not None else ''}: {name}"
    reason += f" ({severity})" if severity else ""
    evidence = {"source": source, "sxid": finding.xid, "matched": finding.detail or None}
    return _Candidate(f"sxid:{finding.xid}", reason, evidence, "node")


def _judge_finding(finding: Finding, source: str) -> _Candidate | None:
    rule = FINDING_BY_KIND.get(finding.kind)
    if rule is None or rule[0] != "hardware":
        return None
    reason = rule[1]
    kind = finding.kind
    detail = (finding.detail or "").strip()
    if kind == FindingKind.GPU_COUNT:
        if finding.value is not None and finding.expected is not None:
            if finding.value >= finding.expected:
                return None
            reason = f"only {finding.value} of {finding.expected} GPUs visible"
    elif kind == FindingKind.ECC_UNCORRECTED:
        if finding.value is not None and finding.value <= 0:
            return None
        if finding.value is not None:
            reason = f"{finding.value} uncorrected ECC error(s)"
    elif kind == FindingKind.RECOVERY_ACTION:
        if finding.value is not None:
            if finding.value == 0:
                return None
            reason = f"driver recovery action: {RECOVERY_ACTIONS.get(finding.value, f'action {finding.value}')}"
        elif detail.lower() in {"", "none", "0", "nvml_gpu_recovery_action_none"}:
            return None
        else:
            reason = f"driver recovery action: {detail}"
    elif kind == FindingKind.THERMAL:
        # Software (driver-imposed) thermal slowdown is a cooling-policy matter, not a fault.
        if re.search(r"(?i)(?:^|[^a-z])sw(?:[^a-z]|$)|software", detail):
            return None
    elif kind == FindingKind.NVLINK_DOWN and finding.value is not None:
        reason = f"NVLink link {finding.value} down"
    text = reason + (f" on GPU {finding.gpu}" if finding.gpu is not None else "")
    if kind in DETAIL_IN_REASON and detail and detail.lower() not in text.lower():
        text = f"{text} ({_trim(detail, 120)})"
    evidence = {"source": source, "kind": kind, "gpu": finding.gpu, "value": finding.value, "expected": finding.expected, "matched": detail or None}
    node_wide = kind in NODE_KINDS or finding.gpu is None or (kind == FindingKind.RECOVERY_ACTION and finding.value in NODE_RECOVERY)
    return _Candidate(f"finding:{kind}", text[0].upper() + text[1:], evidence, "node" if node_wide else "gpu")


# A kernel message names no GPU the classifier can map: its fault is node-wide.


def _kernel_signature_candidates(kernel_lines: Sequence[str]) -> list[_Candidate]:
    candidates: list[_Candidate] = []
    seen: set[str] = set()
    for line in kernel_lines:
        event = parse_kernel_line(line)
        if event is None or event.kind not in KERNEL_REASONS or event.kind in seen:
            continue
        seen.add(event.kind)
        evidence = {"source": "kernel_log", "signature": event.kind, "matched": _trim(line.strip())}
        if event.nic:
            evidence["nic"] = event.nic
        candidates.append(_Candidate(f"kernel:{event.kind}", f"kernel log: {KERNEL_REASONS[event.kind]}", evidence, "node"))
    return candidates


def _oom_killer_records(kernel_lines: Sequence[str]) -> list[str]:
    """The kernel's own OOM-killer records (``parse_kernel_line``: as the kernel writes them): the only
    kernel text a non-hardware reason may come from, and only the host OOM kill's."""
    out = []
    for line in kernel_lines:
        event = parse_kernel_line(line)
        if event is not None and event.kind == "oom_kill":
            out.append(event.text)
    return out


# --- helpers -------------------------------------------------------------------------------------


def _xid_label(finding: Finding) -> str:
    if finding.gpu is not None:
        return f"Xid {finding.xid} on GPU {finding.gpu}"
    event = parse_kernel_line(finding.detail.removeprefix("(named as cause) ")) if finding.detail else None
    return f"Xid {finding.xid} on PCI {event.pci}" if event is not None and event.pci else f"Xid {finding.xid}"


def _describe_support(supporting: Sequence[tuple[Finding, str]]) -> str:
    parts = []
    for finding, _ in supporting:
        text = FINDING_BY_KIND[finding.kind][1]
        if finding.gpu is not None:
            text += f" on GPU {finding.gpu}"
        if text not in parts:
            parts.append(text)
    return ", ".join(parts)


def _hardware(candidate: _Candidate, exit_facts: dict[str, Any], supporting: Sequence[tuple[Finding, str]]) -> Verdict:
    return Verdict(hardware=True, reason=candidate.reason, evidence=_clean(candidate.evidence, exit_facts, supporting))


def _clean(evidence: dict[str, Any], exit_facts: dict[str, Any], supporting: Sequence[tuple[Finding, str]]) -> dict[str, Any]:
    merged = {k: v for k, v in evidence.items() if v not in (None, "")}
    for key in ("exit_code", "exit_signal"):
        if exit_facts.get(key) is not None:
            merged[key] = exit_facts[key]
    if supporting:
        merged["supporting"] = [dict(f.to_dict(), source=src) for f, src in supporting]
    return merged
