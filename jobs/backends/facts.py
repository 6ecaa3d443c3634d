"""What an engine tells the control plane about its nodes, as typed values rather than attributes
to look for (issue 44). So far: where the health evidence of an agent's nodes comes from."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class LocalKernel:
    """The nodes' evidence is this machine's own: its kernel log and NVML (the agents, one on
    each GPU machine)."""


@dataclass(frozen=True)
class NodeCheckFiles:
    """Each node's own health check hands its evidence over as files in ``directory``
    (``failover.nodecheck``, run by Slurm as its ``HealthCheckProgram``): the nodes are not this
    machine."""

    directory: Path


EvidenceSource = LocalKernel | NodeCheckFiles
