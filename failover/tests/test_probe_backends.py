"""The same GPU timelines through both backends: NVML (the fake pynvml) and simulated GPUs.
Whichever reads the node, the fault shows as the same finding on the same GPU, and the verdict is
"hardware"; a healthy node reads nominal before the fault."""

from __future__ import annotations

import pytest

from failover.classify import classify_failure
from failover.evidence import FindingKind
from failover.models import SimulatedFault
from failover.nvml import NvmlProbe
from failover.probes import SimulatedProbe
from failover.tests import fake_pynvml
from jobs.models import Node

pytestmark = pytest.mark.django_db

# scenario → (what happens on the NVML machine, the simulated fault, the finding it must give)
SCENARIOS = {
    "xid_mid_run": (lambda gpus: gpus.xid(1, 79), dict(kind="xid", xid=79), FindingKind.XID),
    "ecc_rise": (lambda gpus: setattr(gpus.gpus[1], "ecc_uncorrected", 3), dict(kind="ecc"), FindingKind.ECC_UNCORRECTED),
    "gpu_lost": (lambda gpus: gpus.lose(1), dict(kind="gpu_lost"), FindingKind.GPU_LOST),
    "nvlink_down": (lambda gpus: gpus.link_down(1, 0), dict(kind="nvlink"), FindingKind.NVLINK_DOWN),
}


class Backend:
    def __init__(self, name: str, node: Node) -> None:
        self.name, self.node = name, node
        if name == "nvml":
            self.gpus = fake_pynvml.reset(gpus=4)
            self.probe = NvmlProbe(node.name, expected_gpus=4, nvml=fake_pynvml, timeout=1.0)
        else:
            self.probe = SimulatedProbe(node.name)

    def fault(self, scenario: str) -> None:
        on_nvml, simulated, _ = SCENARIOS[scenario]
        if self.name == "nvml":
            on_nvml(self.gpus)
        else:
            SimulatedFault.objects.create(node=self.node, gpu=1, **simulated)

    def close(self) -> None:
        if self.name == "nvml":
            self.probe.close()
            self.gpus.release()


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("backend", ["nvml", "simulated"])
def test_a_fault_reads_the_same_through_either_backend(backend, scenario, nodes):
    reader = Backend(backend, Node.objects.get(name="node-a"))
    try:
        assert reader.probe.check().nominal
        reader.fault(scenario)
        report = reader.probe.check()
    finally:
        reader.close()

    expected = SCENARIOS[scenario][2]
    assert (expected, 1) in {(f.kind, f.gpu) for f in report.findings}, report.findings
    assert all(f.gpu in (1, None) for f in report.findings)  # no other GPU is blamed
    assert classify_failure(exit_code=1, findings=report.findings).hardware
