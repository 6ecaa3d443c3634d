"""Serve the console with Daphne, with the embedded control loop (placement + node agent)."""

from __future__ import annotations

import logging

from daphne.endpoints import build_endpoint_description_strings
from daphne.server import Server
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from agent.backend import describe, start_local_agent
from agent.loop import EmbeddedControlLoop
from console.asgi import application, when_server_ready
from console.env import env_int, env_str

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Set up on first run and serve the console on http://127.0.0.1:8000 (PORT overrides)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default=env_str("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=env_int("PORT", 8000))

    def handle(self, *args, host: str, port: int, **options):
        call_command("bootstrap")
        loop = None
        if settings.EMBEDDED_AGENT:
            loop = EmbeddedControlLoop(start_local_agent())
            loop.start()

        self.stdout.write(f"Simple AI Training console on http://{host}:{port}/  (Ctrl-C to stop; running jobs keep running)")
        if where := describe():
            self.stdout.write(where)
        try:
            Server(
                application=application,
                endpoints=build_endpoint_description_strings(host=host, port=port),
                signal_handlers=True,
                ready_callable=when_server_ready,
            ).run()
        finally:
            if loop:
                loop.stop()
                loop.join(15)  # the agent's shutdown: plug-ins stop their threads, NVML is shut down
