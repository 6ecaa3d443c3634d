"""Whether the cluster could ever hold a job's shape: checked when a job is created, so a request
no node can take is refused with the largest shape there is instead of waiting for ever.

Every registered node counts, whatever its health or cordon now (both change); only the number of
GPUs a node has bounds what it can hold. With no node registered yet nothing is refused: the
agents may not have reported their inventory.
"""

from __future__ import annotations

from collections import Counter

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


# Node.agent of the nodes a Slurm cluster runs: each is a host of its own.
SLURM_AGENT = "slurm"


def ranks_share_one_host(agents: set[str]) -> bool:
    """Whether ranks on nodes served by ``agents`` (``Node.agent``) run on one host, and so can
    share one job network: one agent's nodes are one machine's (the embedded agent's simulated
    nodes, several node agents started on one machine); a Slurm cluster's nodes are hosts of
    their own."""
    return len(agents) == 1 and SLURM_AGENT not in agents


def network_refusal(project, node_count: int) -> str | None:
    """Why ``project`` may not run a job on ``node_count`` nodes, or None. Ranks on one host share
    a network of their own; ranks on different hosts meet only on the hosts' network, which an
    operator allows per project (``Project.multi_node_host_network``). Checked where a job is
    created, cloned or resumed, and again where its ranks start (``job_network``)."""
    if node_count <= 1 or project is None or project.multi_node_host_network:
        return None
    by_agent = Counter(Node.objects.values_list("agent", flat=True))
    if not by_agent or any(count >= node_count and agent != SLURM_AGENT for agent, count in by_agent.items()):
        return None
    return (
        f"The ranks of a {node_count}-node job would run on different hosts, where they meet only on the hosts' network, "
        f"which an operator has not allowed for project {project.name}: run on 1 node, or ask an operator."
    )


def job_network(project, node_agents: set[str], node_count: int) -> tuple[str, str | None]:
    """The network an attempt's ranks run in, on the nodes it was placed on (their ``Node.agent``),
    under the project's current settings: ``("loopback" | "job" | "host", None)``, or
    ``("", why)`` where the settings no longer allow it (a job queued before they changed)."""
    if node_count > 1 and not ranks_share_one_host(node_agents):
        if project.multi_node_host_network:
            return "host", None
        return "", (
            "its ranks were placed on different hosts, where they meet only on the hosts' network, "
            f"which an operator has not allowed for project {project.name}"
        )
    if node_count == 1 and project.effective_egress == "none":
        return "loopback", None
    return "job", None
