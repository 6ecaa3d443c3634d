"""Resource sampling, an agent plug-in: every ``RESOURCE_SAMPLE_INTERVAL`` seconds, what each run on
this agent's nodes uses — its GPUs' utilisation, memory and power, and its processes' host CPU and
memory — reported to ``jobs.services.samples`` (one reading per job and round).

GPU readings come from a ``GpuReader``. Simulated nodes get synthetic readings (a busy GPU's
load wanders smoothly, so a chart has something honest to show: these are not measurements);
real nodes' NVML readings belong with the health probe (``failover``), which can register a reader
with ``use_gpu_reader``. Without one a real node's GPU fields stay empty; host CPU and memory are
read from the run's process tree either way.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psutil
from django.conf import settings
from django.utils import timezone

from agent import cgroups, runfiles
from agent.plugins import AgentView
from agent.processes import run_dir
from jobs.models import GPU, AttemptNode
from jobs.services.samples import Reading, record_readings

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GpuReading:
    util: float  # percent
    mem_mb: float
    power_w: float


class GpuReader(Protocol):
    def read(self, node_name: str, gpu_indices: Sequence[int]) -> dict[int, GpuReading]:
        """Readings of these GPUs of a node this process serves (missing: not readable)."""


class SimulatedGpuReader:
    """Synthetic readings for simulated GPUs: utilisation 55–95 % moving slowly, memory and power
    following it. Deterministic in (node, GPU, time)."""

    def __init__(self, memory_mb: dict[tuple[str, int], int]) -> None:
        self.memory_mb = memory_mb

    def read(self, node_name: str, gpu_indices: Sequence[int]) -> dict[int, GpuReading]:
        now = time.time()
        readings = {}
        for index in gpu_indices:
            phase = (sum(map(ord, node_name)) % 17) + 3 * index
            util = 75 + 20 * math.sin(now / 13 + phase) * math.cos(now / 47 + phase / 2)
            total = self.memory_mb.get((node_name, index)) or 81_920
            readings[index] = GpuReading(util=round(util, 1), mem_mb=round(total * (0.35 + 0.004 * util)), power_w=round(90 + 3.8 * util, 1))
        return readings


_real_reader: GpuReader | None = None


def use_gpu_reader(reader: GpuReader | None) -> None:
    """Where real GPUs are read (NVML): the reader for every non-simulated node of this process."""
    global _real_reader
    _real_reader = reader


class ResourceSampler:
    """The plug-in: one instance per agent (``agent.plugins.register(ResourceSampler)``)."""

    def __init__(self, agent: AgentView) -> None:
        self.agent = agent
        self.last = 0.0
        self.processes: dict[int, psutil.Process] = {}

    def next_round_in(self) -> float:
        """Only while runs are live (an idle agent does not wake to sample nothing)."""
        if settings.RESOURCE_SAMPLE_INTERVAL <= 0 or not self.agent.live_parts():
            return math.inf
        return max(0.0, self.last + settings.RESOURCE_SAMPLE_INTERVAL - time.monotonic())

    def on_round(self) -> None:
        now = time.monotonic()
        interval = settings.RESOURCE_SAMPLE_INTERVAL
        if interval <= 0 or now - self.last < interval:
            return
        span = min(now - self.last, interval * 2) if self.last else interval
        self.last = now
        parts = self.agent.live_parts()
        if not parts:
            self.processes.clear()
            return
        memory = {
            (node, index): mb
            for node, index, mb in GPU.objects.filter(node__name__in={p.node.name for p in parts}).values_list("node__name", "index", "memory_mb")
        }
        simulated = SimulatedGpuReader(memory)
        totals: dict[tuple[int, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        seen_pids: set[int] = set()
        for part in parts:
            key = (part.attempt.job_id, part.attempt.number)
            reader = simulated if part.node.simulated else _real_reader
            if reader is not None and part.gpu_indices:
                try:
                    for reading in reader.read(part.node.name, list(part.gpu_indices)).values():
                        totals[key]["util"].append(reading.util)
                        totals[key]["mem"].append(reading.mem_mb)
                        totals[key]["power"].append(reading.power_w)
                except Exception:
                    logger.exception("could not read the GPUs of %s for job %s", part.node.name, key[0])
            cpu, rss = self.host_usage(part.runner_pid, seen_pids, run_processes(part))
            if cpu is not None:
                totals[key]["cpu"].append(cpu)
                totals[key]["rss"].append(rss)
        for pid in set(self.processes) - seen_pids:
            del self.processes[pid]
        stamp = timezone.now()
        readings = []
        for (job_id, attempt), values in totals.items():
            readings.append(
                Reading(
                    job_id=job_id,
                    attempt=attempt,
                    ts=stamp,
                    span_s=round(span, 3),
                    gpu_util=round(sum(values["util"]) / len(values["util"]), 1) if values["util"] else None,
                    gpu_mem_mb=sum(values["mem"]) if values["mem"] else None,
                    power_w=round(sum(values["power"]), 1) if values["power"] else None,
                    cpu_percent=round(sum(values["cpu"]), 1) if values["cpu"] else None,
                    host_mem_mb=round(sum(values["rss"]), 1) if values["rss"] else None,
                )
            )
        record_readings(readings)

    def host_usage(self, runner_pid: int | None, seen: set[int], extra: set[int] | None = None) -> tuple[float | None, float]:
        """CPU percent (since the last sample) and resident MiB of a run's processes: its runner's
        tree and ``extra`` (its container's, which Podman's monitor parents, not the runner);
        none for a part without a runner (psutil would read the agent's own)."""
        if runner_pid is None:
            return None, 0.0
        try:
            root = psutil.Process(runner_pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None, 0.0
        for pid in (extra or set()) - {p.pid for p in tree}:
            try:
                tree.append(psutil.Process(pid))
            except psutil.Error:
                continue
        cpu = 0.0
        rss = 0.0
        for process in tree:
            known = self.processes.setdefault(process.pid, process)
            seen.add(process.pid)
            try:
                cpu += known.cpu_percent(interval=None)
                rss += known.memory_info().rss / 2**20
            except psutil.Error:
                continue
        return cpu, rss


def run_processes(part: AttemptNode) -> set[int]:
    """The processes of a run's container: every process of its cgroup (the container nests in
    it) and its container's init with its descendants (a run without a cgroup of its own)."""
    record = runfiles.read_pid(run_dir(part))
    if record is None:
        return set()
    found = cgroups.pids([Path(d) for d in record.cgroup]) if record.cgroup else set()
    if record.container_pid:
        try:
            init = psutil.Process(record.container_pid)
            found |= {init.pid, *(child.pid for child in init.children(recursive=True))}
        except psutil.Error:
            pass
    return found
