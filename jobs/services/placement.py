"""Placement: first fit of a job's GPUs over Ready, healthy, uncordoned nodes, oldest job first."""
from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Max, OuterRef, Q, Subquery
from django.utils import timezone

from jobs.services.dispatch import dispatch_launch
from jobs.models import GPU, AttemptNode, Image, JobAttempt, JobExclusion, Node, TrainingJob
from jobs.services.lifecycle import record_reason, record_reasons, transition
from jobs.statuses import JobStatus

logger = logging.getLogger(__name__)


MASTER_PORT_BASE = 29500
MASTER_PORT_SPAN = 20000


class PlacementConflict(Exception):
    """Another placement took a GPU between reading the free ones and holding them."""


@dataclass
class FreeCapacity:
    """Free GPU indices per schedulable node, in node-name order; updated as jobs are placed."""

    nodes: list[tuple[int, str]] = field(default_factory=list)  # (node id, name), by name
    free: dict[int, list[int]] = field(default_factory=dict)
    addresses: dict[int, str] = field(default_factory=dict)

    @classmethod
    def read(cls) -> FreeCapacity:
        rows = list(
            Node.objects.filter(state=Node.State.READY, healthy=True, cordoned=False)
            .order_by("name")
            .values_list("id", "name", "address")
        )
        nodes = [(node_id, name) for node_id, name, _ in rows]
        free: dict[int, list[int]] = defaultdict(list)
        gpus = GPU.objects.filter(node_id__in=[n for n, _ in nodes], allocated_to__isnull=True, healthy=True)
        for node_id, index in gpus.order_by("index").values_list("node_id", "index"):
            free[node_id].append(index)
        return cls(nodes=nodes, free=dict(free), addresses={node_id: address for node_id, _, address in rows})

    def first_fit(
        self,
        gpus_per_node: int,
        node_count: int,
        *,
        exclude_nodes: frozenset[int] | set[int] = frozenset(),
        exclude_gpus: frozenset[tuple[int, int]] | set[tuple[int, int]] = frozenset(),
    ) -> list[tuple[int, list[int]]] | None:
        """``node_count`` distinct nodes with ``gpus_per_node`` free GPUs each, first by name."""
        chosen: list[tuple[int, list[int]]] = []
        for node_id, _name in self.nodes:
            if node_id in exclude_nodes:
                continue
            free = [i for i in self.free.get(node_id, []) if (node_id, i) not in exclude_gpus]
            if len(free) >= gpus_per_node:
                chosen.append((node_id, free[:gpus_per_node]))
                if len(chosen) == node_count:
                    return chosen
        return None

    def take(self, chosen: list[tuple[int, list[int]]]) -> None:
        for node_id, indices in chosen:
            self.free[node_id] = [i for i in self.free.get(node_id, []) if i not in indices]


def waiting_reason(job: TrainingJob) -> str:
    if job.node_count > 1:
        return f"waiting for {job.node_count} nodes with {job.gpus_per_node} free GPUs each"
    return f"waiting for {job.gpus_per_node} GPU{'s' if job.gpus_per_node != 1 else ''}"


def place_waiting_jobs(*, limit: int = 200) -> list[JobAttempt]:
    """Place the jobs waiting for capacity, oldest first; return the attempts created.

    Waiting are Pending jobs, image-pull back-offs whose retry is due, and failovers judged a
    hardware fault. A job never lands on a node (or GPU) it was excluded from, and a Spot job not
    on a node whose spot capacity was just reclaimed. A job that does not fit keeps waiting with
    a reason; younger, smaller jobs may still fit into what is left (backfill).
    """
    now = timezone.now()
    open_attempts = JobAttempt.objects.filter(state__in=[JobAttempt.State.PLACED, JobAttempt.State.RUNNING])
    last_verdict = JobAttempt.objects.filter(job_id=OuterRef("pk")).order_by("-number").values("verdict")[:1]
    candidates = list(
        TrainingJob.objects.filter(status__in=[JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF, JobStatus.FAILOVER_IN_PROGRESS])
        .exclude(pk__in=open_attempts.values("job_id"))
        .annotate(last_verdict=Subquery(last_verdict))
        .filter(~Q(status=JobStatus.FAILOVER_IN_PROGRESS) | Q(last_verdict="hardware"))
        .order_by("created_at", "id")[:limit]
    )
    if not candidates:
        return []
    images = set(Image.objects.filter(reference__in={j.image for j in candidates}).values_list("reference", flat=True))
    capacity = FreeCapacity.read()
    excluded_nodes: dict[int, set[int]] = defaultdict(set)
    excluded_gpus: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for job_id, node_id, gpu in JobExclusion.objects.filter(job_id__in=[j.pk for j in candidates]).values_list("job_id", "node_id", "gpu"):
        if gpu is None:
            excluded_nodes[job_id].add(node_id)
        else:
            excluded_gpus[job_id].add((node_id, gpu))
    spot_held = set(Node.objects.filter(spot_reclaimed_until__gt=now).values_list("id", flat=True))
    placed: list[JobAttempt] = []
    waiting: dict[tuple[str, str], list[int]] = defaultdict(list)  # (status, new reason) → jobs
    for job in candidates:
        if job.image not in images:
            if job.status == JobStatus.PENDING or (job.next_retry_at and job.next_retry_at <= now):
                back_off_image_pull(job, f"image {job.image} is not registered")
            continue
        if job.status == JobStatus.IMAGE_PULL_BACKOFF:
            if job.next_retry_at and job.next_retry_at > now:
                continue
            if not transition(job.pk, JobStatus.PENDING, reason=f"image {job.image} is available", expected={JobStatus.IMAGE_PULL_BACKOFF}):
                continue
            job.refresh_from_db(fields=["status", "status_reason"])
        avoid = excluded_nodes[job.pk] | (spot_held if job.job_type == TrainingJob.JobType.SPOT else set())
        chosen = capacity.first_fit(job.gpus_per_node, job.node_count, exclude_nodes=avoid, exclude_gpus=excluded_gpus[job.pk])
        if chosen is None:
            reason = waiting_reason(job)
            if excluded_nodes[job.pk]:
                count = len(excluded_nodes[job.pk])
                reason += f" on a node it is not excluded from ({count} node{'s' if count != 1 else ''} excluded after faults)"
            if job.status_reason != reason:
                waiting[(job.status, reason)].append(job.pk)
            continue
        try:
            placed.append(hold_placement(job, chosen, node_names=dict(capacity.nodes), master_addr=capacity.addresses[chosen[0][0]]))
        except PlacementConflict:
            logger.info("job %s: placement raced with another; retrying next round", job.pk)
            capacity = FreeCapacity.read()
            continue
        capacity.take(chosen)
    for (status, reason), job_ids in waiting.items():
        record_reasons(job_ids, status=status, reason=reason, actor="placement")
    return placed


def hold_placement(
    job: TrainingJob, chosen: list[tuple[int, list[int]]], *, node_names: dict[int, str], master_addr: str
) -> JobAttempt:
    """Create the attempt and hold its GPUs by compare-and-swap, all in one transaction."""
    with transaction.atomic():
        number = (JobAttempt.objects.filter(job=job).aggregate(m=Max("number"))["m"] or 0) + 1
        # A port per attempt, the same for every rank wherever its agent runs.
        port = MASTER_PORT_BASE + (job.pk * 4 + number) % MASTER_PORT_SPAN
        attempt = JobAttempt.objects.create(job=job, number=number, master_addr=master_addr, master_port=port)
        names = []
        for rank, (node_id, indices) in enumerate(chosen):
            part = AttemptNode.objects.create(attempt=attempt, node_id=node_id, rank=rank, gpu_indices=indices)
            held = GPU.objects.filter(node_id=node_id, index__in=indices, allocated_to__isnull=True).update(allocated_to=part)
            if held != len(indices):
                raise PlacementConflict
            names.append(f"{node_names.get(node_id, node_id)} GPU {','.join(map(str, indices)) or '-'}")
        reason = f"placed on {', '.join(names)}; starting"
        record_reason(job.pk, reason=reason, expected={job.status}, actor="placement", attempt=number)
        dispatch_launch(attempt, [node_names.get(node_id, "") for node_id, _ in chosen])
    logger.info("job %s: attempt %s %s", job.pk, number, reason)
    return attempt


def back_off_image_pull(job: TrainingJob, reason: str) -> None:
    """Record a failed image resolution and when to try again (exponential, capped)."""
    tries = job.pull_attempts + 1
    delay = min(settings.IMAGE_PULL_BACKOFF_BASE * 2 ** (tries - 1), settings.IMAGE_PULL_BACKOFF_MAX)
    next_retry = timezone.now() + timedelta(seconds=delay)
    full_reason = f"{reason}; retry {tries} in {delay:.0f}s"
    if job.status != JobStatus.IMAGE_PULL_BACKOFF:
        transition(job.pk, JobStatus.IMAGE_PULL_BACKOFF, reason=full_reason, pull_attempts=tries, next_retry_at=next_retry)
    else:
        record_reason(
            job.pk, reason=full_reason, expected={JobStatus.IMAGE_PULL_BACKOFF}, pull_attempts=tries, next_retry_at=next_retry
        )


def release_gpus(attempt: JobAttempt) -> None:
    GPU.objects.filter(allocated_to__attempt=attempt).update(allocated_to=None)


def abandon_open_attempts(job_id: int, *, cause: str) -> None:
    """Give up attempts that never started (the job was stopped or its image vanished)."""
    now = timezone.now()
    for attempt in JobAttempt.objects.filter(job_id=job_id, state=JobAttempt.State.PLACED):
        with transaction.atomic():
            release_gpus(attempt)
            JobAttempt.objects.filter(pk=attempt.pk, state=JobAttempt.State.PLACED).update(
                state=JobAttempt.State.ABANDONED, ended_at=now, cause=cause[:500]
            )


def release_part_gpus(part: AttemptNode) -> None:
    """Free one rank's GPUs (its node was lost, or it never started) while the others run on."""
    GPU.objects.filter(allocated_to=part).update(allocated_to=None)
