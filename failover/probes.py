"""GPU health probes: one interface, two backends (NVML in ``failover.nvml``, and simulated GPUs).

``probe_for(node).check()`` returns a :class:`HealthReport` of findings. The failover logic
cannot tell the two backends apart.
"""

from __future__ import annotations

import logging
from typing import Protocol

from failover.evidence import Finding, FindingKind, HealthReport
from failover.models import SimulatedFault
from failover.nvml import NvmlProbe
from failover.xids import bus_id
from jobs.models import GPU

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
        """GPU index by PCI ``domain:bus:device`` (``xids.bus_id``), to scope kernel-log Xid lines."""
        ...


def simulated_bus(gpu: int | None) -> str:
    return f"0000:{0x18 + (gpu or 0) * 0x10:02x}:00"


class SimulatedProbe:
    """Reads the faults an operator injected into a simulated node."""

    def __init__(self, node_name: str) -> None:
        self.node_name = node_name

    def check(self) -> HealthReport:

        findings: list[Finding] = []
        faults = SimulatedFault.objects.filter(node__name=self.node_name, cleared_at__isnull=True).order_by("created_at")
        for fault in faults:
            findings.extend(simulated_findings(fault.kind, fault.gpu, fault.xid))
        return HealthReport(node=self.node_name, findings=tuple(findings), source="simulated")

    def kernel_log(self) -> str:

        lines = []
        for fault in SimulatedFault.objects.filter(node__name=self.node_name, cleared_at__isnull=True).order_by("created_at"):
            xid = fault_xid(fault.kind, fault.xid)
            if xid is not None:
                bus = simulated_bus(fault.gpu)
                lines.append(f"NVRM: Xid (PCI:{bus}): {xid}, pid=0, name=python, {XID_TEXT.get(xid, 'Graphics Exception')}")
        return "\n".join(lines)

    def gpu_by_pci(self) -> dict[str, int]:

        indices = GPU.objects.filter(node__name=self.node_name).values_list("index", flat=True)
        return {bus_id(simulated_bus(index)): index for index in indices}


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


def probe_for(node) -> HealthProbe:
    """A new probe for the node. An NVML probe holds NVML and an event set until ``close()``:
    make one per node and keep it (``failover.services.health.local_probe``)."""
    if node.simulated:
        return SimulatedProbe(node.name)
    return NvmlProbe(node.name, expected_gpus=node.gpus.count())


__all__ = ["HealthProbe", "NvmlProbe", "SimulatedProbe", "probe_for", "simulated_findings"]
