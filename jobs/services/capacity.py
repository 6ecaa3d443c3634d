"""Whether the cluster could ever hold a job's shape: checked when a job is created, so a request
no node can take is refused with the largest shape there is instead of waiting for ever.

Every registered node counts, whatever its health or cordon now (both change); only the number of
GPUs a node has bounds what it can hold. With no node registered yet nothing is refused: the
agents may not have reported their inventory.
"""
from __future__ import annotations

from django.db.models import Count

from jobs.models import Node


def gpu_counts() -> list[int]:
    """The number of GPUs of every registered node, largest first."""
    return sorted(Node.objects.annotate(n=Count("gpus")).values_list("n", flat=True), reverse=True)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def shape_refusal(gpus_per_node: int, node_count: int) -> str | None:
    """Why no placement could ever hold ``node_count`` nodes × ``gpus_per_node`` GPUs, or None."""
    counts = gpu_counts()
    if not counts:
        return None
    if gpus_per_node > counts[0]:
        return (
            f"No node has {plural(gpus_per_node, 'GPU')}: the largest node has {plural(counts[0], 'GPU')}. "
            f"Ask for at most {counts[0]} per node (and more nodes) instead."
        )
    fitting = sum(1 for n in counts if n >= gpus_per_node)
    if node_count > fitting:
        if not gpus_per_node:
            return f"The cluster has {plural(fitting, 'node')}; this job asks for {plural(node_count, 'node')}."
        return (
            f"Only {plural(fitting, 'node')} {'has' if fitting == 1 else 'have'} {gpus_per_node} or more GPUs; "
            f"this job asks for {plural(node_count, 'node')}. The largest shape is {fitting} × {gpus_per_node} GPUs."
        )
    return None


def network_refusal(project, node_count: int) -> str | None:
    """Why ``project`` may not run a job on ``node_count`` nodes (its ranks need the nodes'
    network, an operator's choice per project), or None."""
    if node_count > 1 and project is not None and not project.multi_node_host_network:
        return (
            f"Multi-node jobs run on their nodes' network, which an operator has not allowed for project {project.name}: "
            "run on 1 node, or ask an operator."
        )
    return None
