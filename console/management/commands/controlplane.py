"""The control loop without Celery beat: ``manage.py controlplane`` runs a control round (lost-node
sweeps, failover judgements, placement) every AGENT_POLL_INTERVAL seconds."""

from __future__ import annotations

import logging
import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand
from django.db import close_old_connections

from jobs.services.control import control_round

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Run the control plane's sweeps and placement in a loop (the alternative to Celery beat)."

    def handle(self, *args, **options):
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        self.stdout.write("control plane started")
        try:
            while not stop.is_set():
                try:
                    control_round()
                except Exception:
                    logger.exception("control round failed; retrying")
                finally:
                    close_old_connections()
                stop.wait(settings.AGENT_POLL_INTERVAL)
        except KeyboardInterrupt:
            pass
