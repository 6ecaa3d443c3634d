"""Operator commands on nodes: inject a fault into a simulated GPU, clear a node, reclaim spot."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from failover.models import NodeHealth, SimulatedFault
from jobs.models import GPU, JobAttempt, JobExclusion, Node, TrainingJob
from jobs.services import wakeups
from jobs.services.messages import wake_agents
from jobs.statuses import JobStatus

logger = logging.getLogger(__name__)


class FaultError(ValueError):
    """The fault cannot be injected as asked; the message says why."""


def inject_fault(node: Node, *, kind: str = "xid", gpu: int | None = None, xid: int | None = None, actor: str = "operator") -> SimulatedFault:
    """Inject a fault into a simulated GPU (``gpu`` None: the whole node).

    The node's agent makes the training processes on that GPU die within one round and its
    health probe reports the fault as NVML would.
    """
    if not node.simulated:
        raise FaultError(f"{node.name} has real GPUs; faults can only be injected into simulated ones.")
    if kind not in SimulatedFault.Kind.values:
        raise FaultError(f"Unknown fault kind {kind!r}; use one of {', '.join(SimulatedFault.Kind.values)}.")
    if gpu is not None and not GPU.objects.filter(node=node, index=gpu).exists():
        raise FaultError(f"{node.name} has no GPU {gpu}.")
    if xid is not None and kind != SimulatedFault.Kind.XID:
        raise FaultError("An Xid number goes with the xid kind only.")
    if xid is not None and not 1 <= xid <= 1000:
        raise FaultError("Xid numbers run from 1 to 1000.")
    fault = SimulatedFault.objects.create(node=node, gpu=gpu, kind=kind, xid=xid if kind == "xid" else None, created_by=actor[:150])
    logger.warning("fault injected by %s: %s", actor, fault)
    # The node's health monitor applies it now (from another process: through the wake file).
    wake_agents([node.name])
    return fault


def clear_node(node: Node, *, actor: str = "operator") -> None:
    """An operator cleared the node: faults are repaired, it is healthy and schedulable again."""
    now = timezone.now()
    with transaction.atomic():
        # A fault that already bit keeps its applied_at; one that never did is closed as of now.
        SimulatedFault.objects.filter(node=node, cleared_at__isnull=True).update(cleared_at=now, applied_at=Coalesce(F("applied_at"), Value(now)))
        Node.objects.filter(pk=node.pk).update(healthy=True, health_reason="", unhealthy_since=None)
        GPU.objects.filter(node=node).update(healthy=True, health_reason="", unhealthy_since=None)
        # The events stay (each kernel line is stored once, so an old Xid still in the ring does
        # not flag the repaired node again); health counts only those after the clear.
        NodeHealth.objects.update_or_create(node=node, defaults={"checked_at": now, "cleared_at": now})
        wake_agents([node.name])  # its health checker reads the cleared state now
        # Repaired: jobs excluded from it after a fault there may be placed on it again.
        lifted = JobExclusion.objects.filter(node=node).delete()[0]
        wakeups.round_wanted()
    logger.info("node %s cleared by %s; %s job exclusion(s) lifted", node.name, actor, lifted)


def reclaim_spot(node: Node, *, actor: str = "operator") -> list[int]:
    """Reclaim the spot capacity of a node: its Spot runs get SIGTERM and the grace period.

    The agent stops them (ckptlib saves on SIGTERM); their jobs go back to ``Pending`` with the
    reason "spot capacity reclaimed" and resume elsewhere or later from their latest checkpoint.
    Reclaims do not count against the failover limit. Returns the ids of the jobs reclaimed.
    """
    now = timezone.now()
    hold = timedelta(seconds=settings.SPOT_RECLAIM_HOLD)
    attempts = JobAttempt.objects.filter(
        state=JobAttempt.State.RUNNING,
        placements__node=node,
        job__job_type=TrainingJob.JobType.SPOT,
        job__status=JobStatus.RUNNING,
    ).distinct()
    job_ids = list(attempts.values_list("job_id", flat=True))
    with transaction.atomic():
        JobAttempt.objects.filter(pk__in=attempts.values("pk")).update(reclaimed=True, stop_requested_at=now)
        wake_agents([node.name])
        Node.objects.filter(pk=node.pk).update(spot_reclaimed_until=now + hold)
        wakeups.round_wanted()  # the hold's end is the round's timed work from now on
    logger.warning("spot capacity on %s reclaimed by %s: jobs %s", node.name, actor, job_ids)
    return job_ids
