"""The engine of a Slurm cluster in a scale-out deployment: ``manage.py slurmengine``.

On ``BACKEND=slurm`` Slurm's nodes take no node agent (``manage.py nodeagent`` refuses): one
process per cluster drives Slurm for them. It registers the cluster's nodes from ``scontrol show
node``, then runs the Slurm engine (``agent.slurm.SlurmEngine``: one batch job per attempt,
Slurm's records read every ``SLURM_POLL_INTERVAL``) in a loop thread, as ``runconsole``'s embedded
loop does but without the control rounds (``manage.py controlplane`` or Celery beat runs those).
With a broker (``REDIS_URL``) it is also the Celery worker of every one of the cluster's node
queues (``node.NAME``): placement's launches and stops reach it there. Run exactly one per cluster.
"""

from __future__ import annotations

import socket

from django.core.management.base import BaseCommand, CommandError

from agent.backend import SLURM, backend_kind, start_local_agent
from agent.loop import EmbeddedControlLoop
from console.management.commands.nodeagent import serve
from jobs.services.messages import node_queue


class Command(BaseCommand):
    help = "Drive a Slurm cluster's nodes (BACKEND=slurm): the Celery worker of their queues when REDIS_URL is set."

    def handle(self, *args, **options):
        if backend_kind() != SLURM:
            raise CommandError("BACKEND is not slurm: run `manage.py nodeagent --name NODE` on each GPU node instead (docs/deployment.md)")
        engine = start_local_agent(name="slurm")
        loop = EmbeddedControlLoop(engine, control=False)
        loop.start()
        names = list(engine.node_names)
        self.stdout.write(f"Slurm engine for {len(names)} node{'s' * (len(names) != 1)} ({', '.join(names)}) started")
        serve(loop, [node_queue(name) for name in names], worker=f"slurmengine@{socket.gethostname()}")
