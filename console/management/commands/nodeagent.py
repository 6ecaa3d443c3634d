"""The node agent of one GPU node: ``manage.py nodeagent --name NODE``.

Beats first (a restart never lets a healthy node look lost while it starts), registers the node
(its real GPUs through NVML, or simulated ones), then supervises runs: a loop thread sleeps until
something is due (a heartbeat, live runs' output every OUTPUT_POLL_INTERVAL, a reconcile every
AGENT_RECONCILE_INTERVAL) or a message arrives. With a broker (REDIS_URL) the process is also a
Celery worker consuming the node's own queue ``node.NODE``: ``agent.launch_attempt`` from placement
and ``agent.reconcile`` when one of its runs must stop. It refuses to start on ``BACKEND=slurm``
(``agent.backend.node_agent_refusal``): Slurm runs the jobs there, driven from ``runconsole``.
"""

from __future__ import annotations

import logging
import signal
import socket

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from agent.backend import node_agent_refusal
from agent.inventory import NodeSpec, discover_nodes, register_nodes, simulated_nodes
from agent.loop import EmbeddedControlLoop
from agent.node_agent import NodeAgent, beat_now
from console.celery import app
from console.prometheus import serve_process_metrics
from jobs.models import Node
from jobs.services.messages import node_queue

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the node agent of one GPU node (a Celery worker on queue node.NAME when REDIS_URL is set)."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="the node's name (a DNS label)")
        parser.add_argument("--address", default=None, help="where other ranks reach this node (default: its hostname)")
        parser.add_argument("--simulated", action="store_true", help="serve simulated GPUs even if NVML is present")

    def handle(self, *args, name: str, address: str | None, simulated: bool, **options):
        if refusal := node_agent_refusal():
            raise CommandError(refusal)
        beat_now([name])
        spec = self.node_spec(name, simulated)
        node = register_nodes([spec], agent=f"nodeagent@{socket.gethostname()}")[0]
        Node.objects.filter(pk=node.pk).update(address=address or ("127.0.0.1" if spec.simulated else socket.getfqdn()))
        agent = NodeAgent([node.name], name=f"nodeagent-{node.name}")
        agent.stop_strays()
        loop = EmbeddedControlLoop(agent, control=False)
        serve_process_metrics("nodeagent")  # its own log-line counts on METRICS_PORT, if set
        loop.start()
        self.stdout.write(f"node agent for {node.name} ({len(spec.gpus)} GPUs{', simulated' if spec.simulated else ''}) started")
        serve(loop, [node_queue(node.name)], worker=f"{node.name}@{socket.gethostname()}")

    @staticmethod
    def node_spec(name: str, simulated: bool) -> NodeSpec:
        specs = simulated_nodes() if simulated else discover_nodes()
        if not specs:
            raise CommandError("no GPUs found")
        first = specs[0]
        return NodeSpec(
            name=name,
            gpu_model=first.gpu_model,
            gpus=tuple(type(g)(index=g.index, uuid=g.uuid.replace(first.name, name), model=g.model, memory_mb=g.memory_mb) for g in first.gpus),
            simulated=first.simulated,
        )


def serve(loop: EmbeddedControlLoop, queues: list[str], *, worker: str) -> None:
    """Serve a started agent loop until SIGTERM: with a broker (``SCALE_OUT``) as the Celery worker
    of ``queues`` (launches and stops reach the agent there), else until the loop stops. The loop
    is stopped and joined on the way out (its agent's shutdown: plug-ins stop, NVML is shut down)."""
    try:
        if settings.SCALE_OUT:
            app.worker_main(
                ["worker", "-Q", ",".join(queues), "-n", worker, "-P", "solo",
                 "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "WARNING"]
            )  # fmt: skip
        else:
            signal.signal(signal.SIGTERM, lambda *_: loop.stopped.set())
            while not loop.stopped.wait(1.0):
                pass
    except KeyboardInterrupt:
        pass
    finally:
        loop.stopped.set()
        loop.join(15)
