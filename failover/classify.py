"""Failure classification for Job Failover: hardware fault or not, and why.

A pure function (stdlib only, no Django) from the way a run stopped (exit code or signal), the
node's health evidence (NVML findings and the kernel log's ``NVRM: Xid`` lines) and the run's last
log lines to a :class:`Verdict`.

The rule: fail over only on *evidence* of a hardware fault. Evidence is a node-side reading (an
NVML finding, a kernel-log Xid or kernel hardware message) or an unambiguous hardware signature in
the run's own output ("uncorrectable ECC error encountered", "GPU is lost", "fallen off the bus").
A bare mention of a component ("Using NVLink for all-reduce", "ECC mode enabled", an ``nvidia-smi``
table) is not evidence, and neither is a user's own exception that merely quotes hardware words.

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
import signal as _signal
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from failover.evidence import Finding, FindingKind

HARDWARE = "hardware"
NON_HARDWARE = "non-hardware"

# --- Table 1: Xid codes -------------------------------------------------------------------------
# (xid, class, reason). Classes:
#   "hardware"    — a hardware fault by itself;
#   "remap"       — Xid 63: hardware only with evidence that the remap *failed* (a REMAP_FAILURE
#                   finding, or Xid 64 alongside). A pending remap is the normal outcome of Xid 63
#                   (the row is marked and waits for a reset) and is no fault of the run;
#   "recovery"    — Xid 154: hardware when the driver's new recovery action is not "None";
#   "application" — usually the application's own fault; hardware only with ECC or remap evidence
#                   (ECC evidence is hardware by itself; remap evidence upgrades these).
# Xids not listed are not evidence by themselves.
#
# Sources: NVIDIA's Xid catalogue (docs.nvidia.com/deploy/xid-errors, the "resolution" column:
# RESET_GPU / RESTART_BM / WORKFLOW_XID_*), and the public rule sets built on it: NVIDIA
# Resiliency Extension (NVRx, github.com/NVIDIA/nvidia-resiliency-ext, its health checks) and
# gpud (github.com/leptonai/gpud, components/accelerator/nvidia/xid, which marks each Xid
# "reset GPU" / "reboot"). Where the catalogue names an Xid only by its resolution, the reason
# says that rather than guessing a name.
XID_RULES: tuple[tuple[int, str, str], ...] = (
    (79, "hardware", "GPU has fallen off the bus"),
    (48, "hardware", "double-bit (uncorrectable) ECC error"),
    (64, "hardware", "row-remapping / page-retirement failure"),
    (95, "hardware", "uncontained ECC error"),
    (94, "hardware", "contained ECC error"),
    (140, "hardware", "unrecovered ECC error"),
    (74, "hardware", "NVLink error"),
    (144, "hardware", "NVLink error (SAW)"),
    (145, "hardware", "NVLink error (RLW)"),
    (146, "hardware", "NVLink error (TLW)"),
    (147, "hardware", "NVLink error (TREX)"),
    (148, "hardware", "NVLink error (NVLPW)"),
    (149, "hardware", "NVLink error (NETIR)"),
    (150, "hardware", "NVLink error (MSE)"),
    (119, "hardware", "GSP RPC timeout"),
    (120, "hardware", "GSP error"),
    (143, "hardware", "GPU initialization failure"),
    (46, "hardware", "GPU stopped processing"),
    # Catalogued with the resolution "reset the GPU".
    (62, "hardware", "internal micro-controller halt (GPU reset required)"),
    (110, "hardware", "security fault error (GPU reset required)"),
    (136, "hardware", "GPU error whose catalogued resolution is a GPU reset"),
    (155, "hardware", "GPU error whose catalogued resolution is a GPU reset"),
    (156, "hardware", "GPU error whose catalogued resolution is a GPU reset"),
    (158, "hardware", "GPU error whose catalogued resolution is a GPU reset"),
    # Catalogued with the resolution "reboot the node".
    (121, "hardware", "GPU error whose catalogued resolution is a node reboot"),
    (167, "hardware", "GPU error whose catalogued resolution is a node reboot"),
    (169, "hardware", "GPU error whose catalogued resolution is a node reboot"),
    (154, "recovery", "GPU recovery action changed"),
    (63, "remap", "ECC page retirement / row-remapping event"),
    (13, "application", "graphics engine exception"),
    (31, "application", "GPU memory page fault (MMU fault)"),
    (43, "application", "GPU stopped processing the channel (reset channel)"),
    (45, "application", "preemptive channel removal"),
    # Disputed: a context-switch timeout follows a hung or faulting kernel (often after an
    # application Xid 13) as often as a hardware fault; alone it is the application's.
    (109, "application", "context-switch timeout"),
)
XID_BY_CODE: dict[int, tuple[str, str]] = {xid: (cls, reason) for xid, cls, reason in XID_RULES}

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
    1: "GPU reset required", 2: "node reboot required", 3: "drain P2P", 4: "drain and reset",
    5: "recover the IMEX domain", 6: "bus reset required", 7: "system reboot required",
}
# Kinds whose probe detail says something the reason does not (which port, which condition).
DETAIL_IN_REASON = frozenset({FindingKind.THERMAL, FindingKind.NETWORK_LINK})
REMAP_EVIDENCE_KINDS = frozenset(
    {FindingKind.REMAP_PENDING, FindingKind.REMAP_FAILURE, FindingKind.RETIRED_PAGES_PENDING}
)
# What makes Xid 63 a fault: the remap failed (NVRx / gpud: a failed remap needs the GPU replaced).
REMAP_FAILED_KINDS = frozenset({FindingKind.REMAP_FAILURE})

# --- Table 3: kernel-log hardware messages (besides Xid lines) ----------------------------------
# (name, pattern, reason). Corrected / non-fatal AER messages are deliberately not listed.
KERNEL_SIGNATURES: tuple[tuple[str, str, str], ...] = (
    ("fallen_off_bus", r"fallen off the bus", "GPU has fallen off the bus"),
    ("gpu_lost", r"\bGPU is lost\b", "GPU is lost"),
    ("pcie_fatal", r"Uncorrect(?:ed|able) \(Fatal\)", "PCIe fatal (uncorrected) error"),
    ("network_link_down", r"mlx5_core\b.*\blink\s+down\b", "InfiniBand / RoCE link down"),
    ("thermal_shutdown", r"critical temperature reached.*shutting down|\bthermal shutdown\b",
     "thermal shutdown"),
    # GSP firmware stopped answering (the driver's lines around Xid 119; NVRx and gpud reset the GPU).
    ("gsp_timeout", r"Timeout waiting for RPC from GSP|\bGSP\b.*\bheartbeat\b.*(?:timeout|timed out|missed)|"
     r"\bGSP (?:RPC )?Timeout\b", "GSP firmware not responding (RPC / heartbeat timeout)"),
)

# --- Table 4: hardware signatures in the run's own output ---------------------------------------
# (name, pattern, reason). On a Python exception line these count only when the line carries a
# runtime error prefix (RUNTIME_PREFIX): "RuntimeError: CUDA error: uncorrectable ECC error
# encountered" is hardware, a user's "ValueError: GPU has fallen off the bus?" is not.
LOG_HARDWARE_SIGNATURES: tuple[tuple[str, str, str], ...] = (
    ("ecc_uncorrectable", r"uncorrectable ECC error encountered|ECC_UNCORRECTABLE|cudaErrorECCUncorrectable",
     "uncorrectable ECC error encountered"),
    ("gpu_lost", r"\bGPU is lost\b|NVMLError_GPUIsLost|NVML_ERROR_GPU_IS_LOST", "GPU is lost"),
    ("fallen_off_bus", r"fallen off the bus", "GPU has fallen off the bus"),
    ("nvlink_uncorrectable", r"uncorrectable NVLink error|cudaErrorNvlinkUncorrectable|NVLINK_UNCORRECTABLE",
     "uncorrectable NVLink error"),
    ("ib_port_error", r"NET/IB\w* ?: Got async event ?: port error|IBV_EVENT_PORT_ERR",
     "InfiniBand port error (link down or flapping)"),
    # CUDA's "uncorrectable error contained": the GPU needs a reset (CUDA driver API docs).
    ("cuda_contained", r"CUDA_ERROR_CONTAINED|cudaErrorContained", "uncorrectable GPU error contained (GPU reset needed)"),
    # nvidia-smi's own words when the driver cannot reach a GPU any more.
    ("device_handle_unknown", r"Unable to determine the device handle for (?:GPU|gpu)\S*.*Unknown Error",
     "nvidia-smi cannot reach the GPU (Unknown Error)"),
)
RUNTIME_PREFIX = re.compile(r"CUDA error|CUDA_ERROR_|cudaError|cuda runtime error|NVMLError|NVML_ERROR|NCCL")

# --- Table 5: internal (non-hardware) errors, most specific first --------------------------------
# (name, pattern, reason, ambiguous). reason None: the matched line itself is the reason (Python
# exceptions). Ambiguous ones become hardware when the node shows supporting evidence.
NON_HARDWARE_SIGNATURES: tuple[tuple[str, str, str | None, bool], ...] = (
    ("cuda_oom", r"CUDA out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation",
     "CUDA out of memory", False),
    ("device_assert", r"device-side assert(?:ion)? triggered|Assertion `.*` failed",
     "device-side assert triggered", False),
    ("state_dict_mismatch", r"size mismatch for |Error\(s\) in loading state_dict",
     "shape mismatch loading a checkpoint (state_dict)", False),
    ("nan_loss", r"(?i)loss became infinite or nan|\bloss\b[\w\s]{0,20}(?:is|=|:)\s*nan\b|\bnan loss\b",
     "NaN / infinite loss", False),
    ("import_error", r"\b(?:ModuleNotFoundError|ImportError): .*", None, False),
    ("syntax_error", r"\b(?:SyntaxError|IndentationError|TabError): .*", None, False),
    ("missing_file", r"\bFileNotFoundError: .*|No such file or directory", None, False),
    ("permission_denied", r"\bPermissionError: .*|Permission denied", None, False),
    ("bad_arguments", r"error: (?:unrecognized arguments|the following arguments are required|argument )",
     None, False),
    ("illegal_memory_access", r"illegal memory access was encountered|cudaErrorIllegalAddress|"
     r"CUDA_ERROR_ILLEGAL_ADDRESS", "illegal memory access", True),
    ("launch_failure", r"unspecified launch failure", "unspecified launch failure", True),
    ("nccl_timeout", r"Watchdog caught collective operation timeout|NCCL[^\n]*timed out|"
     r"collective operation timeout", "NCCL collective timeout", True),
    ("nccl_ib_completion", r"NET/IB\w* ?: Got completion from peer", "NCCL network (IB) completion error", True),
    ("host_oom_kill", r"Out of memory: Kill(?:ed)? process|invoked oom-killer|oom-kill:|"
     r"Signal 9 \(SIGKILL\)|exitcode\s*:\s*-9\b|killed by signal: Killed",
     "killed by SIGKILL (host OOM kill?)", False),
    # Launcher wrappers (torchrun's ChildFailedError, subprocess's CalledProcessError) only repeat
    # that a child failed; the child's own exception is the more specific reason.
    ("python_exception", r"^(?!.*(?:ChildFailedError|CalledProcessError))(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): .*",
     None, False),
)

# The order in which hardware evidence is reported when several kinds apply (first wins).
HARDWARE_PRIORITY: tuple[str, ...] = (
    "xid:79", "finding:gpu_lost", "kernel:fallen_off_bus", "kernel:gpu_lost", "xid:48", "xid:95",
    "xid:94", "xid:140", "finding:ecc_uncorrected", "xid:64", "finding:remap_failure", "xid:63",
    "kernel:pcie_fatal", "xid:74", "xid:144", "xid:145", "xid:146", "xid:147", "xid:148", "xid:149",
    "xid:150", "finding:nvlink_down", "finding:network_link", "kernel:network_link_down",
    "xid:62", "xid:110", "xid:136", "xid:155", "xid:156", "xid:158", "xid:121", "xid:167", "xid:169",
    "xid:119", "xid:120", "kernel:gsp_timeout", "xid:143", "xid:46", "xid:154", "finding:recovery_action",
    "finding:reset_required", "finding:gpu_count", "finding:thermal", "kernel:thermal_shutdown",
    "xid:13", "xid:31", "xid:43", "xid:45", "xid:109",
)
_PRIORITY_RANK = {key: rank for rank, key in enumerate(HARDWARE_PRIORITY)}

_XID_LINE = re.compile(r"(?:NVRM: )?\bXid \((?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+)(?:,\s*(?P<rest>.*))?")
_CAUSED_BY = re.compile(r"caused by previous Xid (\d+)")
_RECOVERY_TARGET = re.compile(r"recovery action changed from .*? to (?:0x[0-9A-Fa-f]+ )?\(([^)]*)\)")
_SOURCE_ECHO = re.compile(r'^\s*File "[^"]*", line \d+')
_EXCEPTION_LINE = re.compile(r"^(?:[\w.]+\.)?[A-Z]\w*(?:Error|Exception): ")
_RANK_PREFIX = re.compile(r"^\s*(?:\[(?:rank|default)\d*\]:?\s*|\[\d+\]\s*|stderr:\s*)+")
_MAX_MATCHED = 300


@dataclass(frozen=True)
class Verdict:
    """The classifier's judgement of one stopped run."""

    hardware: bool
    reason: str  # one line for users, e.g. "Xid 79 on GPU 2: GPU has fallen off the bus"
    evidence: dict = field(default_factory=dict)  # JSON-serialisable

    @property
    def verdict(self) -> str:
        return HARDWARE if self.hardware else NON_HARDWARE

    def to_dict(self) -> dict:
        return {"verdict": self.verdict, "reason": self.reason, "evidence": self.evidence}


@dataclass(frozen=True)
class _Candidate:
    """One piece of hardware evidence, before the most important one is picked."""

    key: str  # "xid:79", "finding:gpu_lost", "kernel:pcie_fatal"
    reason: str
    evidence: dict

    @property
    def rank(self) -> int:
        return _PRIORITY_RANK.get(self.key, len(_PRIORITY_RANK))


def pci_key(address: str) -> str:
    """``bus:device`` of a PCI address, lower case: the kernel's ``0000:3b:00`` and NVML's
    ``00000000:3B:00.0`` both become ``3b:00``."""
    parts = address.split(".")[0].lower().split(":")
    return ":".join(parts[-2:])


def parse_kernel_xids(kernel_log: str, gpu_by_pci: Mapping[str, int] | None = None) -> list[Finding]:
    """Xid findings from kernel-log text (``dmesg`` / ``journalctl -k``).

    ``NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus.`` becomes
    ``Finding(kind="xid", xid=79, detail="NVRM: Xid (PCI:0000:3b:00): 79, ...")``. A line saying
    "caused by previous Xid 149" also yields a finding for Xid 149, which the driver names as the
    root cause. ``gpu`` is the index ``gpu_by_pci`` (keys from :func:`pci_key`) gives the line's
    PCI address; None where it is not known.
    """
    findings: list[Finding] = []
    for line in (kernel_log or "").splitlines():
        match = _XID_LINE.search(line)
        if not match:
            continue
        detail = _trim(line[match.start():])
        gpu = (gpu_by_pci or {}).get(pci_key(match["pci"]))
        findings.append(Finding(kind=FindingKind.XID, gpu=gpu, xid=int(match["xid"]), detail=detail))
        cause = _CAUSED_BY.search(line)
        if cause:
            findings.append(Finding(kind=FindingKind.XID, gpu=gpu, xid=int(cause[1]), detail=f"(named as cause) {detail}"))
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
    exit_facts = _exit_facts(exit_code, exit_signal)
    nvml_findings = list(findings)
    kernel_findings = list(kernel_findings) + parse_kernel_xids(kernel_log)
    kernel_lines = (kernel_log or "").splitlines()
    node_findings = [(f, "nvml") for f in nvml_findings] + [(f, "kernel_log") for f in kernel_findings]

    supporting = [(f, src) for f, src in node_findings if f.kind in SUPPORTING_KINDS]
    xids_present = {f.xid for f, _ in node_findings if f.kind == FindingKind.XID and f.xid is not None}
    has_remap_failure = any(f.kind in REMAP_FAILED_KINDS for f, _ in node_findings) or 64 in xids_present

    # 1. Node-side evidence.
    candidates: list[_Candidate] = []
    application_xids: list[tuple[Finding, str]] = []
    unconfirmed_xids: list[tuple[Finding, str]] = []  # Xid 63 without remap evidence
    for finding, source in node_findings:
        if finding.kind == FindingKind.XID:
            judged = _judge_xid(finding, source, has_remap_failure)
            if judged == "application":
                application_xids.append((finding, source))
            elif judged == "unconfirmed":
                unconfirmed_xids.append((finding, source))
            elif isinstance(judged, _Candidate):
                candidates.append(judged)
        else:
            judged = _judge_finding(finding, source)
            if judged is not None:
                candidates.append(judged)
    candidates.extend(_kernel_signature_candidates(kernel_lines))
    if candidates:
        return _hardware(min(candidates, key=lambda c: c.rank), exit_facts, supporting)

    # 2. Unambiguous hardware signatures in the run's own output.
    log_hit = _first_log_hardware_signature(log_lines)
    if log_hit is not None:
        name, reason, line = log_hit
        evidence: dict[str, object] = {"source": "log", "signature": name, "matched": line}
        return _hardware(_Candidate(f"log:{name}", f"run log: {reason}", evidence), exit_facts, supporting)

    # 3. Ambiguous failures with supporting node evidence.
    non_hw = _most_specific_internal_error(log_lines, kernel_lines)
    if supporting:
        support_text = _describe_support(supporting)
        if application_xids:
            finding, source = application_xids[0]
            xid_reason = _xid_reason(finding)
            evidence = {"source": source, "xid": finding.xid, "matched": finding.detail or None, "gpu": finding.gpu}
            reason = f"{_xid_label(finding)}: {xid_reason}, with node evidence: {support_text}"
            return _hardware(_Candidate(f"xid:{finding.xid}", reason, evidence), exit_facts, supporting)
        if non_hw is not None and non_hw[3]:
            name, reason, line, _ = non_hw
            evidence = {"source": "log", "signature": name, "matched": line}
            return _hardware(_Candidate(f"log:{name}", f"{reason} with node evidence: {support_text}", evidence),
                             exit_facts, supporting)

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


# --- judging node-side findings ------------------------------------------------------------------

def _xid_reason(finding: Finding) -> str:
    """The catalogue's reason for the finding's Xid (one the catalogue knows: it was judged)."""
    return XID_BY_CODE.get(finding.xid, ("", ""))[1] if finding.xid is not None else ""


def _judge_xid(finding: Finding, source: str, has_remap_failure: bool) -> _Candidate | str | None:
    """A hardware candidate; "application" for an application-class Xid; "unconfirmed" for Xid 63
    without a failed remap; None for an Xid that is no evidence at all."""
    rule = XID_BY_CODE.get(finding.xid) if finding.xid is not None else None
    if rule is None:
        return None
    cls, reason = rule
    if cls == "application":
        return "application"
    if cls == "remap" and not has_remap_failure:
        return "unconfirmed"
    if cls == "recovery":
        target = _RECOVERY_TARGET.search(finding.detail or "")
        if target and target[1].strip().lower() == "none":
            return None
        if target:
            reason = f"{reason} to {target[1].strip()}"
    if cls == "remap":
        reason = f"{reason} with a failed remap"
    evidence = {"source": source, "xid": finding.xid, "gpu": finding.gpu, "matched": finding.detail or None}
    return _Candidate(f"xid:{finding.xid}", f"{_xid_label(finding)}: {reason}", evidence)


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
    evidence = {"source": source, "kind": kind, "gpu": finding.gpu, "value": finding.value,
                "expected": finding.expected, "matched": detail or None}
    return _Candidate(f"finding:{kind}", text[0].upper() + text[1:], evidence)


def _kernel_signature_candidates(kernel_lines: Sequence[str]) -> list[_Candidate]:
    candidates = []
    for name, pattern, reason in KERNEL_SIGNATURES:
        regex = re.compile(pattern, re.IGNORECASE)
        for line in kernel_lines:
            if regex.search(line):
                evidence = {"source": "kernel_log", "signature": name, "matched": _trim(line.strip())}
                candidates.append(_Candidate(f"kernel:{name}", f"kernel log: {reason}", evidence))
                break
    return candidates


# --- scanning the run's own output -----------------------------------------------------------------

def _log_lines_to_scan(lines: Iterable[str]) -> list[str]:
    """The lines worth matching: traceback source echoes (the user's own code) are skipped."""
    scanned: list[str] = []
    previous_was_file_line = False
    for raw in lines:
        line = _RANK_PREFIX.sub("", raw.rstrip("\n")).strip()
        if previous_was_file_line:
            previous_was_file_line = False
            if not _SOURCE_ECHO.match(line) and not _EXCEPTION_LINE.match(line):
                continue
        if _SOURCE_ECHO.match(line):
            previous_was_file_line = True
        scanned.append(line)
    return scanned


def _first_log_hardware_signature(log_lines: Sequence[str]) -> tuple[str, str, str] | None:
    lines = _log_lines_to_scan(log_lines)
    for name, pattern, reason in LOG_HARDWARE_SIGNATURES:
        regex = re.compile(pattern)
        for line in lines:
            if not regex.search(line):
                continue
            if _EXCEPTION_LINE.match(line) and not RUNTIME_PREFIX.search(line):
                continue  # a user's exception quoting hardware words is not a runtime signature
            return name, reason, _trim(line)
    return None


def _most_specific_internal_error(
    log_lines: Sequence[str], kernel_lines: Sequence[str]
) -> tuple[str, str, str, bool] | None:
    lines = _log_lines_to_scan(log_lines) + [line.strip() for line in kernel_lines]
    for name, pattern, reason, ambiguous in NON_HARDWARE_SIGNATURES:
        regex = re.compile(pattern)
        hits = [line for line in lines if regex.search(line)]
        if not hits:
            continue
        line = hits[-1]  # the last occurrence is closest to the failure
        if reason is None:
            match = regex.search(line)
            tail = line[match.start():] if match else line
            reason = _trim(tail if _EXCEPTION_LINE.match(tail) else line, 200)
        return name, reason, _trim(line), ambiguous
    return None


# --- exit status ---------------------------------------------------------------------------------

def _signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _exit_facts(exit_code: int | None, exit_signal: int | None) -> dict:
    facts: dict = {"exit_code": exit_code, "exit_signal": exit_signal}
    signal_number = exit_signal
    if signal_number is None and exit_code is not None:
        if exit_code < 0:
            signal_number = -exit_code
        elif exit_code > 128:
            signal_number = exit_code - 128
    if signal_number:
        name = _signal_name(signal_number)
        facts["reason"] = {
            9: "killed by SIGKILL (host OOM kill?)",
            6: "aborted (SIGABRT)",
            11: "segmentation fault (SIGSEGV)",
            15: "terminated (SIGTERM)",
        }.get(signal_number, f"killed by {name}")
    elif exit_code is not None:
        facts["reason"] = "exited 0 (no failure)" if exit_code == 0 else f"exit code {exit_code}"
    return facts


# --- helpers -------------------------------------------------------------------------------------

def _xid_label(finding: Finding) -> str:
    if finding.gpu is not None:
        return f"Xid {finding.xid} on GPU {finding.gpu}"
    pci = _XID_LINE.search(finding.detail or "")
    return f"Xid {finding.xid} on PCI {pci['pci']}" if pci else f"Xid {finding.xid}"


def _describe_support(supporting: Sequence[tuple[Finding, str]]) -> str:
    parts = []
    for finding, _ in supporting:
        text = FINDING_BY_KIND[finding.kind][1]
        if finding.gpu is not None:
            text += f" on GPU {finding.gpu}"
        if text not in parts:
            parts.append(text)
    return ", ".join(parts)


def _hardware(candidate: _Candidate, exit_facts: dict, supporting: Sequence[tuple[Finding, str]]) -> Verdict:
    return Verdict(hardware=True, reason=candidate.reason, evidence=_clean(candidate.evidence, exit_facts, supporting))


def _clean(evidence: dict, exit_facts: dict, supporting: Sequence[tuple[Finding, str]]) -> dict:
    merged = {k: v for k, v in evidence.items() if v not in (None, "")}
    for key in ("exit_code", "exit_signal"):
        if exit_facts.get(key) is not None:
            merged[key] = exit_facts[key]
    if supporting:
        merged["supporting"] = [dict(f.to_dict(), source=src) for f, src in supporting]
    return merged


def _trim(text: str, limit: int = _MAX_MATCHED) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"
