"""A job's CPU and memory limits: what it asks for, the node's default, and what a node holds;
and the storage limits its runs are held to (``storage_verdicts``).

A job may ask for ``cpu_limit`` cores and ``memory_limit_mb`` MiB per node; what it leaves empty
takes the operator's default (``JOB_DEFAULT_CPUS``, ``JOB_DEFAULT_MEMORY_MB``; unset: no limit).
The agent enforces them with a cgroup per run where the node allows one (``agent.cgroups``); each
node records at registration whether it does (``Node.limits_enforced``, ``Node.limits_note``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

import psutil
from django.conf import settings

from jobs.backends.facts import format_memory
from jobs.models import Node, TrainingJob

MIN_CPUS = 0.01  # cgroups' smallest quota: 1 ms of CPU time per 100 ms
MIN_MEMORY_MB = 32  # below this, not even the interpreter starts
MEMORY_TEXT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m|mb|mi|mib|g|gb|gi|gib)?\s*$", re.I)


class LimitRefused(ValueError):
    """A requested limit this console cannot give; ``field`` names which, the message says why."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Limits:
    cpus: float | None
    memory_mb: int | None
    cpus_default: bool
    memory_default: bool

    @property
    def any(self) -> bool:
        return self.cpus is not None or self.memory_mb is not None

    def describe(self) -> str:
        cpus = "no CPU limit" if self.cpus is None else f"{format_cpus(self.cpus)} CPU core{'s' if self.cpus != 1 else ''}"
        memory = "no memory limit" if self.memory_mb is None else f"{format_memory(self.memory_mb)} memory"
        return f"{cpus}{' (default)' if self.cpus_default else ''}, {memory}{' (default)' if self.memory_default else ''}"


def default_limits() -> tuple[float | None, int | None]:
    cpus = float(settings.JOB_DEFAULT_CPUS or 0)
    memory = int(settings.JOB_DEFAULT_MEMORY_MB or 0)
    return (cpus if cpus > 0 else None), (memory if memory > 0 else None)


def limits_of(job: TrainingJob) -> Limits:
    """What the job runs with on each node: its own request, else the default."""
    cpus, memory = default_limits()
    return Limits(
        cpus=job.cpu_limit if job.cpu_limit is not None else cpus,
        memory_mb=job.memory_limit_mb if job.memory_limit_mb is not None else memory,
        cpus_default=job.cpu_limit is None and cpus is not None,
        memory_default=job.memory_limit_mb is None and memory is not None,
    )


def format_cpus(cpus: float) -> str:
    return f"{cpus:g}"


def parse_memory(text: str) -> int:
    """MiB from "512", "512M", "512 MiB", "8G", "1.5 GiB"; a plain number is MiB."""
    match = MEMORY_TEXT.match(text)
    if not match:
        raise ValueError("Give the memory as MiB, or with a unit: 512M, 8G, 1.5 GiB.")
    value, unit = float(match[1]), (match[2] or "m").lower()
    mb = value * 1024 if unit.startswith("g") else value
    if mb != int(mb):
        raise ValueError("Give the memory in whole MiB.")
    return int(mb)


def largest_node() -> tuple[int, int]:
    """The CPU count and memory (MiB) of the largest registered node (this machine's where no node
    has said yet): no request may exceed it."""
    known = Node.objects.filter(cpu_count__isnull=False, memory_mb__isnull=False)
    sizes = [(cpus, mb) for cpus, mb in known.values_list("cpu_count", "memory_mb") if cpus is not None and mb is not None]
    if sizes:
        return max(s[0] for s in sizes), max(s[1] for s in sizes)
    return machine_size()


def machine_size() -> tuple[int, int]:
    return os.cpu_count() or 1, psutil.virtual_memory().total // 2**20


def check_limits(cpu_limit: float | None = None, memory_limit_mb: int | None = None) -> dict[str, float | int | None]:
    """The requested limits, checked against the largest node; raises ``LimitRefused``."""
    cpus, memory = largest_node()
    if cpu_limit is not None:
        if not cpu_limit >= MIN_CPUS:  # also refuses NaN
            raise LimitRefused("cpu_limit", f"Ask for at least {MIN_CPUS} CPU cores (a share of one core is fine, e.g. 0.5).")
        if cpu_limit > cpus:
            raise LimitRefused("cpu_limit", f"The largest node has {cpus} CPU cores: ask for at most {cpus}.")
        cpu_limit = round(cpu_limit, 2)
    if memory_limit_mb is not None:
        if memory_limit_mb < MIN_MEMORY_MB:
            raise LimitRefused("memory_limit_mb", f"Ask for at least {MIN_MEMORY_MB} MiB of memory.")
        if memory_limit_mb > memory:
            raise LimitRefused("memory_limit_mb", f"The largest node has {format_memory(memory)} of memory ({memory} MiB): ask for at most that.")
    return {"cpu_limit": cpu_limit, "memory_limit_mb": memory_limit_mb}


def unenforced_nodes(job: TrainingJob) -> list[Node]:
    """The nodes of the job's latest attempt that run it without limits (before it is placed:
    every Ready node that would)."""
    attempt = job.attempts.order_by("-number").first()
    nodes = Node.objects.filter(placements__attempt=attempt) if attempt else Node.objects.filter(state=Node.State.READY)
    return list(nodes.filter(limits_enforced=False).distinct().order_by("name"))


# --- storage -------------------------------------------------------------------------------------
# The first words of the causes of a run ended at a storage limit (``storage_verdicts``).
STORAGE_LIMIT = "storage limit reached"
PROJECT_STORAGE_LIMIT = "project storage limit reached"


@dataclass(frozen=True)
class StorageUse:
    """What one job's run uses of its node's disk, as its agent measured it (``agent.storage``):
    bytes allocated to its work and output directories and its containers' writable layers.
    ``complete``: False when the walk stopped at its bound (``used`` is then a lower bound)."""

    job_id: int
    project_id: int
    attempt_id: int
    used: int
    complete: bool = True


def job_storage_limit() -> int | None:
    """Bytes a job's run may use on a node (``JOB_STORAGE_LIMIT_GIB``; None: no limit)."""
    gib = float(settings.JOB_STORAGE_LIMIT_GIB or 0)
    return int(gib * 2**30) if gib > 0 else None


def format_storage(size: float) -> str:
    """``10.4 GiB``, ``51.2 MiB``, ``10 GiB``: one decimal at most."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{int(size)} bytes"


def storage_verdicts(uses: list[StorageUse], *, job_limit: int | None, project_limits: dict[int, tuple[str, int]]) -> dict[int, str]:
    """The runs that must end, by attempt id, each with its reason: every run over the job
    limit; then, in each project whose running jobs together use more than its total
    (``project_limits``: id → name and bytes), the largest users of those left, until the rest fit."""
    ending: dict[int, str] = {}
    for use in uses:
        if job_limit is not None and use.used > job_limit:
            at_least = "" if use.complete else "at least "
            ending[use.attempt_id] = (
                f"{STORAGE_LIMIT}: used {at_least}{format_storage(use.used)} of its {format_storage(job_limit)} storage limit "
                "(work and output directories and the container's own files): stopped"
            )
    for project_id, (name, limit) in project_limits.items():
        mine = [use for use in uses if use.project_id == project_id]
        total = sum(use.used for use in mine)
        left = total - sum(use.used for use in mine if use.attempt_id in ending)
        largest = sorted((u for u in mine if u.attempt_id not in ending), key=lambda u: u.used, reverse=True)
        for rank, use in enumerate(largest):
            if left <= limit:
                break
            most = "the most" if rank == 0 else "the most of those left"
            ending[use.attempt_id] = (
                f"{PROJECT_STORAGE_LIMIT}: project {name}'s running jobs used {format_storage(total)} of its "
                f"{format_storage(limit)} storage total; this job used {most} ({format_storage(use.used)}): stopped"
            )
            left -= use.used
    return ending
