"""The node agent of one GPU node: ``manage.py nodeagent --name NODE``.

Registers the node (its real GPUs through NVML, or simulated ones), then supervises runs: a loop
thread heartbeats, checks health, enforces stops, collects output and exits, and starts placed
attempts it finds; with a broker (REDIS_URL) the process is also a Celery worker consuming the
node's own queue ``node.NODE``, through which placement dispatches launches at once.
"""
from __future__ import annotations

import logging
import signal
import socket
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections

from jobs.agent import runtime
from jobs.agent.inventory import NodeSpec, discover_nodes, register_nodes, simulated_nodes
from jobs.agent.local import NodeAgent
from jobs.models import Node

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the node agent of one GPU node (a Celery worker on queue node.NAME when REDIS_URL is set)."

    def add_arguments(self, parser):
        parser.add_argument("--name", required=True, help="the node's name (a DNS label)")
        parser.add_argument("--address", default=None, help="where other ranks reach this node (default: its hostname)")
        parser.add_argument("--simulated", action="store_true", help="serve simulated GPUs even if NVML is present")

    def handle(self, *args, name: str, address: str | None, simulated: bool, **options):
        spec = self.node_spec(name, simulated)
        node = register_nodes([spec], agent=f"nodeagent@{socket.gethostname()}")[0]
        Node.objects.filter(pk=node.pk).update(address=address or ("127.0.0.1" if spec.simulated else socket.getfqdn()))
        agent = NodeAgent([node.name], name=f"nodeagent-{node.name}")
        runtime.current_agent = agent
        stop = threading.Event()
        loop = threading.Thread(target=self.supervise, args=(agent, stop), name=f"agent-{node.name}", daemon=True)
        loop.start()
        self.stdout.write(f"node agent for {node.name} ({len(spec.gpus)} GPUs{', simulated' if spec.simulated else ''}) started")
        try:
            if settings.SCALE_OUT:
                from console.celery import app

                app.worker_main(
                    [
                        "worker",
                        "-Q", runtime.node_queue(node.name),
                        "-n", f"{node.name}@{socket.gethostname()}",
                        "-P", "solo",
                        "--without-gossip", "--without-mingle", "--without-heartbeat",
                        "-l", "WARNING",
                    ]
                )
            else:
                signal.signal(signal.SIGTERM, lambda *_: stop.set())
                while not stop.wait(1.0):
                    pass
        except KeyboardInterrupt:
            pass
        finally:
            stop.set()

    @staticmethod
    def node_spec(name: str, simulated: bool) -> NodeSpec:
        specs = simulated_nodes() if simulated else discover_nodes()
        if not specs:
            raise CommandError("no GPUs found")
        first = specs[0]
        return NodeSpec(name=name, gpu_model=first.gpu_model, gpus=tuple(
            type(g)(index=g.index, uuid=g.uuid.replace(first.name, name), model=g.model, memory_mb=g.memory_mb) for g in first.gpus
        ), simulated=first.simulated)

    @staticmethod
    def supervise(agent: NodeAgent, stop: threading.Event) -> None:
        agent.stop_strays()
        while not stop.is_set():
            try:
                agent.tick()
            except Exception:
                logger.exception("agent round failed; retrying")
            finally:
                close_old_connections()
            stop.wait(settings.OUTPUT_POLL_INTERVAL)
