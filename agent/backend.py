"""Which engine runs the console's jobs: the one reader of ``settings.BACKEND``.

``agents`` (the default): the console's own node agents (``agent.node_agent``), one per GPU
machine or the embedded one. ``slurm``: a Slurm cluster, each rank a batch job, served by the Slurm
agent (``agent.slurm``) from the console's embedded loop. What depends on the choice asks here:
which nodes the embedded loop registers and which agent serves them, ``runconsole``'s banner, and
``nodeagent``, which serves the machine it runs on and so refuses on Slurm.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from agent.inventory import discover_nodes, register_nodes
from agent.node_agent import NodeAgent
from jobs.backends.base import Backend

if TYPE_CHECKING:
    from jobs.models import Node

AGENTS = "agents"
SLURM = "slurm"


def backend_kind() -> str:
    """``agents`` or ``slurm`` (``BACKEND``)."""
    kind = settings.BACKEND
    if kind not in (AGENTS, SLURM):
        raise ImproperlyConfigured(f"BACKEND={kind!r}: it is {AGENTS!r} (the default) or {SLURM!r}")
    return kind


def replicates() -> bool:
    """Whether runs replicate their snapshots (checkpointless failover): the agents do, a Slurm
    site's ranks run beside no agent (docs/failover.md)."""
    return bool(settings.CHECKPOINTLESS) and backend_kind() == AGENTS


def register_local_nodes(*, name: str = "embedded") -> list[Node]:
    """This machine's nodes (real or simulated); on ``BACKEND=slurm`` the Slurm cluster's."""
    if backend_kind() == SLURM:
        from agent.slurm import slurm_nodes, slurm_scheduler

        return register_nodes(slurm_nodes(slurm_scheduler().nodes()), agent="slurm")
    return register_nodes(discover_nodes(), agent=name)


def start_local_agent(*, name: str = "embedded") -> Backend:
    """Register the local nodes and return the engine serving them (a ``jobs.backends.base.Backend``);
    on ``BACKEND=slurm`` the cluster's nodes, served through Slurm (``agent.slurm``)."""
    nodes = register_local_nodes(name=name)
    if backend_kind() == SLURM:
        from agent.slurm import SlurmEngine

        return SlurmEngine([n.name for n in nodes])
    agent = NodeAgent([n.name for n in nodes], name=name)
    agent.sweep_strays()  # what runs killed with the last console left in the container engine
    return agent


def describe() -> str:
    """``runconsole``'s line about where jobs run ("" on the agents: the nodes page says)."""
    if backend_kind() == SLURM:
        return f"Jobs run as Slurm batch jobs on the cluster of {settings.SLURM_CONF or 'the default slurm.conf'}"
    return ""


def node_agent_refusal() -> str:
    """Why ``manage.py nodeagent`` (the agent of the machine it runs on) must not run; "" when it
    may. On Slurm the cluster's nodes are Slurm's: a node agent would run jobs on its own machine,
    around Slurm."""
    if backend_kind() == SLURM:
        return (
            "BACKEND=slurm: Slurm runs the jobs on its nodes, driven by the console's Slurm engine: "
            "`manage.py runconsole`'s embedded loop, or in a scale-out deployment one `manage.py slurmengine` per cluster; "
            "a node agent would run them on this machine around Slurm. Run no nodeagent on a Slurm cluster (docs/slurm.md)."
        )
    return ""
