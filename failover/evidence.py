"""Health evidence about a node's GPUs, as the probes (NVML or simulated) report it.

Pure data, no Django: the probes produce it, the classifier judges it, events store it as JSON.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class FindingKind:
    XID = "xid"  # an Xid critical-error event (NVML event or kernel-log NVRM line); ``xid`` set
    SXID = "sxid"  # an NVSwitch SXid kernel-log line (node-wide: the fabric); ``xid`` holds the SXid
    ECC_UNCORRECTED = "ecc_uncorrected"  # volatile uncorrected ECC count > 0; ``value`` = count
    RETIRED_PAGES_PENDING = "retired_pages_pending"  # a page retirement waits for a reset
    REMAP_PENDING = "remap_pending"  # row remapping pending (needs a reset)
    REMAP_FAILURE = "remap_failure"  # row remapping failed
    GPU_LOST = "gpu_lost"  # NVML_ERROR_GPU_IS_LOST / fallen off the bus
    RESET_REQUIRED = "reset_required"  # NVML_ERROR_RESET_REQUIRED
    GPU_COUNT = "gpu_count"  # fewer GPUs visible than expected; ``value`` = visible, ``expected``
    PCIE_REPLAY = "pcie_replay"  # PCIe replay counter grew; ``value`` = count
    PCIE_LINK_DEGRADED = "pcie_link_degraded"  # link width below max; ``value`` = current width
    NVLINK_DOWN = "nvlink_down"  # an NVLink link inactive; ``value`` = link number
    NVLINK_ERRORS = "nvlink_errors"  # NVLink CRC/replay/recovery error counters grew
    THERMAL = "thermal"  # hardware slowdown / thermal shutdown clock reasons
    RECOVERY_ACTION = "recovery_action"  # the driver's recovery action is not NONE; ``detail`` names it
    NETWORK_LINK = "network_link"  # InfiniBand / RoCE port down
    DRIVER_ERROR = "driver_error"  # an NVML call hung past the watchdog, or failed unexpectedly

    ALL = (
        XID,
        SXID,
        ECC_UNCORRECTED,
        RETIRED_PAGES_PENDING,
        REMAP_PENDING,
        REMAP_FAILURE,
        GPU_LOST,
        RESET_REQUIRED,
        GPU_COUNT,
        PCIE_REPLAY,
        PCIE_LINK_DEGRADED,
        NVLINK_DOWN,
        NVLINK_ERRORS,
        THERMAL,
        RECOVERY_ACTION,
        NETWORK_LINK,
        DRIVER_ERROR,
    )


@dataclass(frozen=True)
class Finding:
    """One reading that is not nominal. ``gpu`` is the GPU index on its node (None: node-wide)."""

    kind: str
    gpu: int | None = None
    xid: int | None = None
    value: int | None = None
    expected: int | None = None
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v not in (None, "")}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        return cls(**{k: data[k] for k in ("kind", "gpu", "xid", "value", "expected", "detail") if k in data})


@dataclass(frozen=True)
class HealthReport:
    """What a probe saw on one node at one moment."""

    node: str
    findings: tuple[Finding, ...] = field(default_factory=tuple)
    source: str = "simulated"  # "nvml" | "simulated"

    @property
    def nominal(self) -> bool:
        return not self.findings
