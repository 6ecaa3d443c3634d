"""GPU health probes: one interface, two backends (NVML through pynvml, and simulated GPUs).

``probe_for(node).check()`` returns a :class:`HealthReport` of findings. The failover logic
cannot tell the two backends apart.
"""
from __future__ import annotations

import logging
import subprocess
from typing import Protocol

from failover.evidence import Finding, FindingKind, HealthReport

logger = logging.getLogger(__name__)

XID_TEXT = {
    79: "GPU has fallen off the bus.",
    48: "DBE (Double Bit Error) ECC Error.",
    74: "NVLink: fatal error detected on link 0.",
    94: "Contained ECC error.",
    95: "Uncontained ECC error.",
    64: "ECC page retirement or row remapper recording failure.",
}


class HealthProbe(Protocol):
    """One node's health, read the same way from NVML or from simulated GPUs."""

    def check(self) -> HealthReport:
        """The GPUs' readings now (Xid events, ECC, retired pages, link state, …)."""
        ...

    def kernel_log(self) -> str:
        """The node's kernel log lines the classifier reads (empty where it cannot be read)."""
        ...

    def gpu_by_pci(self) -> dict[str, int]:
        """GPU index by PCI ``bus:device`` (``classify.pci_key``), to scope kernel-log Xid lines."""
        ...


def simulated_bus(gpu: int | None) -> str:
    return f"0000:{0x18 + (gpu or 0) * 0x10:02x}:00"


class SimulatedProbe:
    """Reads the faults an operator injected into a simulated node."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name

    def check(self) -> HealthReport:
        from failover.models import SimulatedFault

        findings: list[Finding] = []
        faults = SimulatedFault.objects.filter(node__name=self.node_name, cleared_at__isnull=True).order_by("created_at")
        for fault in faults:
            findings.extend(simulated_findings(fault.kind, fault.gpu, fault.xid))
        return HealthReport(node=self.node_name, findings=tuple(findings), source="simulated")

    def kernel_log(self) -> str:
        from failover.models import SimulatedFault

        lines = []
        for fault in SimulatedFault.objects.filter(node__name=self.node_name, cleared_at__isnull=True).order_by("created_at"):
            xid = fault_xid(fault.kind, fault.xid)
            if xid is not None:
                bus = simulated_bus(fault.gpu)
                lines.append(f"NVRM: Xid (PCI:{bus}): {xid}, pid=0, name=python, {XID_TEXT.get(xid, 'Graphics Exception')}")
        return "\n".join(lines)


    def gpu_by_pci(self) -> dict[str, int]:
        from jobs.models import GPU

        indices = GPU.objects.filter(node__name=self.node_name).values_list("index", flat=True)
        return {simulated_bus(index)[5:]: index for index in indices}


def fault_xid(kind: str, xid: int | None) -> int | None:
    return {"xid": xid or 79, "ecc": 48, "gpu_lost": 79, "nvlink": 74, "thermal": None}.get(kind)


def simulated_findings(kind: str, gpu: int | None, xid: int | None) -> list[Finding]:
    """The readings a real GPU with this fault would give through NVML."""
    number = fault_xid(kind, xid)
    found = []
    if number is not None:
        found.append(Finding(kind=FindingKind.XID, gpu=gpu, xid=number, detail=XID_TEXT.get(number, "")))
    if kind == "ecc":
        found.append(Finding(kind=FindingKind.ECC_UNCORRECTED, gpu=gpu, value=1, detail="volatile uncorrected ECC errors"))
    elif kind == "gpu_lost":
        found.append(Finding(kind=FindingKind.GPU_LOST, gpu=gpu, detail="NVML: GPU is lost"))
    elif kind == "nvlink":
        found.append(Finding(kind=FindingKind.NVLINK_DOWN, gpu=gpu, value=0, detail="NVLink link 0 inactive"))
    elif kind == "thermal":
        found.append(Finding(kind=FindingKind.THERMAL, gpu=gpu, detail="HW thermal slowdown / shutdown"))
    return found


class NvmlProbe:
    """Reads the machine's GPUs through NVML. Only exercised where a driver exists.

    Covers: Xid critical-error events, volatile uncorrected ECC counts, retired pages pending,
    row remapping (pending / failure), GPU lost and reset required, PCIe replay counter and link
    width, NVLink state and errors, hardware-slowdown clock reasons, the GPU count against the
    expected count, and the driver's recovery action.
    """

    def __init__(self, node_name: str, *, expected_gpus: int) -> None:
        self.node_name = node_name
        self.expected_gpus = expected_gpus
        self.pcie_replays: dict[int, int] = {}
        self.nvlink_errors: dict[tuple[int, int], int] = {}
        self.events = None  # an Xid event set kept registered between checks, so none is missed

    def check(self) -> HealthReport:
        import pynvml as nv

        findings: list[Finding] = []
        if self.events is None:
            nv.nvmlInit()
            self.events = self.register_xid_events(nv)
        count = nv.nvmlDeviceGetCount()
        if count < self.expected_gpus:
            findings.append(Finding(kind=FindingKind.GPU_COUNT, value=count, expected=self.expected_gpus, detail="fewer GPUs than expected"))
        for index in range(count):
            findings.extend(self.check_gpu(nv, index))
        findings.extend(self.xid_events(nv))
        return HealthReport(node=self.node_name, findings=tuple(findings), source="nvml")

    def check_gpu(self, nv, index: int) -> list[Finding]:
        out: list[Finding] = []
        try:
            handle = nv.nvmlDeviceGetHandleByIndex(index)
        except nv.NVMLError as exc:
            return [self.error_finding(nv, exc, index)]

        def read(fn, *args):
            try:
                return fn(handle, *args)
            except nv.NVMLError_NotSupported:
                return None
            except nv.NVMLError as exc:
                finding = self.error_finding(nv, exc, index)
                if finding.kind != "unknown":
                    out.append(finding)
                return None

        ecc = read(nv.nvmlDeviceGetTotalEccErrors, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        if ecc:
            out.append(Finding(kind=FindingKind.ECC_UNCORRECTED, gpu=index, value=int(ecc), detail="volatile uncorrected ECC errors"))
        pending = read(nv.nvmlDeviceGetRetiredPagesPendingStatus)
        if pending:
            out.append(Finding(kind=FindingKind.RETIRED_PAGES_PENDING, gpu=index, detail="retired pages pending a reset"))
        remap = read(nv.nvmlDeviceGetRemappedRows)
        if remap:
            _corr, _unc, is_pending, failure = remap
            if failure:
                out.append(Finding(kind=FindingKind.REMAP_FAILURE, gpu=index, detail="row remapping failed"))
            elif is_pending:
                out.append(Finding(kind=FindingKind.REMAP_PENDING, gpu=index, detail="row remapping pending"))
        replay = read(nv.nvmlDeviceGetPcieReplayCounter)
        if replay is not None:
            before = self.pcie_replays.get(index, replay)
            self.pcie_replays[index] = replay
            if replay > before:
                out.append(Finding(kind=FindingKind.PCIE_REPLAY, gpu=index, value=int(replay - before), detail="PCIe replays"))
        width, max_width = read(nv.nvmlDeviceGetCurrPcieLinkWidth), read(nv.nvmlDeviceGetMaxPcieLinkWidth)
        if width and max_width and width < max_width:
            out.append(Finding(kind=FindingKind.PCIE_LINK_DEGRADED, gpu=index, value=int(width), expected=int(max_width), detail="PCIe link width degraded"))
        reasons = read(nv.nvmlDeviceGetCurrentClocksEventReasons) if hasattr(nv, "nvmlDeviceGetCurrentClocksEventReasons") else None
        hw_slowdown = getattr(nv, "nvmlClocksEventReasonHwSlowdown", 0x8) | getattr(nv, "nvmlClocksEventReasonHwThermalSlowdown", 0x40)
        if reasons and reasons & hw_slowdown:
            out.append(Finding(kind=FindingKind.THERMAL, gpu=index, value=int(reasons), detail="hardware slowdown clock reason"))
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            state = read(nv.nvmlDeviceGetNvLinkState, link)
            if state is None:
                break
            if state == nv.NVML_FEATURE_DISABLED:
                continue
            errors = 0
            for counter in (nv.NVML_NVLINK_ERROR_DL_REPLAY, nv.NVML_NVLINK_ERROR_DL_RECOVERY, nv.NVML_NVLINK_ERROR_DL_CRC_FLIT):
                errors += read(nv.nvmlDeviceGetNvLinkErrorCounter, link, counter) or 0
            before = self.nvlink_errors.get((index, link), errors)
            self.nvlink_errors[(index, link)] = errors
            if errors > before:
                out.append(Finding(kind=FindingKind.NVLINK_ERRORS, gpu=index, value=int(errors - before), detail=f"NVLink link {link} errors"))
        if hasattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"):
            try:
                (value,) = nv.nvmlDeviceGetFieldValues(handle, [nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
                action = int(value.value.uiVal) if value.nvmlReturn == 0 else 0
                if action:
                    out.append(Finding(kind=FindingKind.RECOVERY_ACTION, gpu=index, value=action, detail=f"driver recovery action {action}"))
            except nv.NVMLError:
                pass
        return out

    @staticmethod
    def error_finding(nv, exc, index: int) -> Finding:
        if isinstance(exc, nv.NVMLError_GpuIsLost):
            return Finding(kind=FindingKind.GPU_LOST, gpu=index, detail="NVML: GPU is lost")
        if isinstance(exc, getattr(nv, "NVMLError_ResetRequired", ())):
            return Finding(kind=FindingKind.RESET_REQUIRED, gpu=index, detail="NVML: GPU requires a reset")
        return Finding(kind="unknown", gpu=index, detail=str(exc))

    @staticmethod
    def register_xid_events(nv):
        try:
            events = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            return False
        for index in range(nv.nvmlDeviceGetCount()):
            try:
                nv.nvmlDeviceRegisterEvents(nv.nvmlDeviceGetHandleByIndex(index), nv.nvmlEventTypeXidCriticalError, events)
            except nv.NVMLError:
                continue
        return events

    def xid_events(self, nv) -> list[Finding]:
        """Drain the Xid critical-error events that arrived since the last check, without blocking."""
        out: list[Finding] = []
        if not self.events:
            return out
        while True:
            try:
                data = nv.nvmlEventSetWait(self.events, 0)
            except nv.NVMLError:  # Timeout: none pending
                break
            gpu = None
            try:
                gpu = int(nv.nvmlDeviceGetIndex(data.device))
            except nv.NVMLError:
                pass
            out.append(Finding(kind=FindingKind.XID, gpu=gpu, xid=int(data.eventData), detail="NVML Xid critical error event"))
        return out

    def gpu_by_pci(self) -> dict[str, int]:
        import pynvml as nv

        from failover.classify import pci_key

        found: dict[str, int] = {}
        try:
            for index in range(nv.nvmlDeviceGetCount()):
                bus = nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(index)).busId
                found[pci_key(bus.decode() if isinstance(bus, bytes) else bus)] = index
        except nv.NVMLError:
            logger.warning("could not read the PCI addresses of %s's GPUs", self.node_name)
        return found

    def kernel_log(self) -> str:
        """The kernel log's recent ``NVRM: Xid`` lines (empty where dmesg is not readable)."""
        try:
            out = subprocess.run(["dmesg", "--notime"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            return ""
        return "\n".join(line for line in out.splitlines()[-2000:] if "NVRM: Xid" in line)


def probe_for(node) -> HealthProbe:
    if node.simulated:
        return SimulatedProbe(node.name)
    return NvmlProbe(node.name, expected_gpus=node.gpus.count())
