"""Operator commands on nodes for the console's Nodes page, and what that page shows of them.

Fault injection, clearing and spot reclaim are ``failover.services.faults``; cordoning is a flag
the placement loop reads (jobs already on the node keep running).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db.models import Prefetch

from failover.models import SimulatedFault
from jobs.models import GPU, AttemptNode, JobAttempt, Node

logger = logging.getLogger(__name__)


def set_cordoned(node: Node, cordoned: bool, *, actor: str) -> None:
    Node.objects.filter(pk=node.pk).update(cordoned=cordoned)
    logger.info("node %s: %s by %s", node.name, "cordoned" if cordoned else "uncordoned", actor)


@dataclass
class NodeView:
    """A node as the Nodes page shows it: its GPUs, who holds them, open faults, running jobs."""

    node: Node
    gpus: list[GPU]
    faults: list[SimulatedFault]
    placements: list[AttemptNode] = field(default_factory=list)

    @property
    def gpus_free(self) -> int:
        return sum(1 for gpu in self.gpus if gpu.allocated_to_id is None and gpu.healthy)

    @property
    def gpus_unhealthy(self) -> int:
        return sum(1 for gpu in self.gpus if not gpu.healthy)


def node_overview() -> list[NodeView]:
    """Every node, in name order, with everything the page shows: four queries in all."""
    open_faults = SimulatedFault.objects.filter(cleared_at__isnull=True).order_by("created_at")
    nodes = Node.objects.order_by("name").prefetch_related(
        Prefetch("gpus", queryset=GPU.objects.select_related("allocated_to__attempt__job").order_by("index")),
        Prefetch("simulated_faults", queryset=open_faults, to_attr="open_faults"),
    )
    views = {node.pk: NodeView(node=node, gpus=list(node.gpus.all()), faults=node.open_faults) for node in nodes}
    live = AttemptNode.objects.filter(
        node_id__in=views, attempt__state__in=[JobAttempt.State.PLACED, JobAttempt.State.RUNNING]
    ).select_related("attempt__job").order_by("attempt__job__name", "rank")
    for placement in live:
        views[placement.node_id].placements.append(placement)
    return list(views.values())
