"""What GPUs a node agent serves: the machine's real GPUs through NVML, or simulated nodes."""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agent import cgroups
from agent.processes import is_runner
from jobs.models import GPU, Node
from jobs.services.limits import machine_size

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuSpec:
    index: int
    uuid: str
    model: str
    memory_mb: int


@dataclass(frozen=True)
class NodeSpec:
    name: str
    gpu_model: str
    gpus: tuple[GpuSpec, ...]
    simulated: bool
    # A cluster's node as its scheduler reports it (None: this machine's, ``machine_size``).
    cpu_count: int | None = None
    memory_mb: int | None = None
    address: str | None = None


def nvml_nodes() -> list[NodeSpec] | None:
    """This machine as one node with its real GPUs; None where NVML (a driver) is unavailable."""
    try:
        import pynvml  # at call time: a test may have put the simulated driver in sys.modules

        pynvml.nvmlInit()
    except Exception as exc:  # no driver, no library: the simulated backend takes over
        logger.info("NVML unavailable (%s); using simulated GPUs", exc)
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total // (1024 * 1024)
            gpus.append(GpuSpec(index=i, uuid=uuid, model=name, memory_mb=int(memory)))
    finally:
        pynvml.nvmlShutdown()
    hostname = socket.gethostname().split(".")[0].lower() or "localhost"
    return [NodeSpec(name=hostname, gpu_model=gpus[0].model if gpus else "", gpus=tuple(gpus), simulated=False)]


def simulated_nodes() -> list[NodeSpec]:
    model = settings.SIMULATED_GPU_MODEL
    nodes = []
    for n in range(settings.SIMULATED_NODES):
        name = f"node-{chr(ord('a') + n)}" if n < 26 else f"node-{n}"
        gpus = tuple(GpuSpec(index=i, uuid=f"GPU-sim-{name}-{i}", model=model, memory_mb=81559) for i in range(settings.SIMULATED_GPUS_PER_NODE))
        nodes.append(NodeSpec(name=name, gpu_model=model, gpus=gpus, simulated=True))
    return nodes


def discover_nodes() -> list[NodeSpec]:
    mode = str(settings.SIMULATED_GPUS).lower()
    if mode in {"1", "true", "yes"}:
        return simulated_nodes()
    real = nvml_nodes()
    if real is not None:
        return real
    if mode in {"0", "false", "no"}:
        raise RuntimeError("SIMULATED_GPUS=0 but NVML is unavailable on this machine")
    return simulated_nodes()


def resource_limits() -> tuple[bool, str]:
    """Whether this machine's runs get their CPU and memory limits, and how (or why not); the
    cgroups of runs whose supervisor died are removed on the way."""
    enforced, note = cgroups.support(settings.JOB_CGROUP_PARENT)
    for same_path in (False, True):  # container runs' cgroups share one path in every controller
        found, _ = cgroups.hierarchy(settings.JOB_CGROUP_PARENT, same_path=same_path)
        if found is not None:
            cgroups.sweep(found, alive=is_runner)
    return enforced, note if enforced else f"CPU and memory limits not enforced: {note}"


def register_nodes(specs: list[NodeSpec], *, agent: str) -> list[Node]:
    """Create or refresh the nodes and GPUs this agent serves; keep operator settings (cordon)."""
    now = timezone.now()
    cpu_count, memory_mb = machine_size()
    enforced, note = resource_limits()
    if not enforced:
        logger.warning("agent %s: %s", agent, note)
    nodes = []
    with transaction.atomic():
        for spec in specs:
            node, _ = Node.objects.update_or_create(
                name=spec.name,
                defaults={
                    "gpu_model": spec.gpu_model,
                    "simulated": spec.simulated,
                    "agent": agent,
                    "state": Node.State.READY,
                    "last_heartbeat": now,
                    "cpu_count": spec.cpu_count or cpu_count,
                    "memory_mb": spec.memory_mb or memory_mb,
                    "limits_enforced": enforced,
                    "limits_note": note[:300],
                    **({"address": spec.address} if spec.address else {}),
                },
            )
            for gpu in spec.gpus:
                GPU.objects.update_or_create(
                    node=node,
                    index=gpu.index,
                    defaults={"uuid": gpu.uuid, "model": gpu.model, "memory_mb": gpu.memory_mb},
                )
            GPU.objects.filter(node=node).exclude(index__in=[g.index for g in spec.gpus]).delete()
            nodes.append(node)
    logger.info("agent %s registered nodes %s", agent, ", ".join(n.name for n in nodes))
    return nodes
