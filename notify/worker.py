"""The embedded delivery worker (no Redis): a scheduler thread and a small pool of senders in
the console process, so a slow or dead endpoint holds up only its own delivery, never a request
nor the agent. Deliveries left pending by a restart are picked up when the worker starts."""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.conf import settings
from django.db import close_old_connections, connection

from notify import services, verification

logger = logging.getLogger(__name__)


class Worker:
    def __init__(self) -> None:
        self.queue: list[tuple[float, int, str, int]] = []
        self.order = itertools.count()
        self.wake = threading.Condition()
        self.pool: ThreadPoolExecutor | None = None
        self.thread: threading.Thread | None = None
        self.busy = 0

    def start(self) -> None:
        with self.wake:
            if self.thread is not None:
                return
            self.pool = ThreadPoolExecutor(max_workers=max(settings.NOTIFY_WORKERS, 1), thread_name_prefix="notify")
            self.thread = threading.Thread(target=self.run, name="notify-scheduler", daemon=True)
            self.thread.start()
        self.submit("recover", 0)

    def submit(self, what: str, ident: int, delay: float = 0.0) -> None:
        if self.thread is None:
            self.start()
        with self.wake:
            heapq.heappush(self.queue, (time.monotonic() + delay, next(self.order), what, ident))
            self.wake.notify()

    def run(self) -> None:
        while True:
            with self.wake:
                while not self.queue or self.queue[0][0] > time.monotonic():
                    self.wake.wait(timeout=None if not self.queue else self.queue[0][0] - time.monotonic())
                _, _, what, ident = heapq.heappop(self.queue)
                self.busy += 1
            assert self.pool is not None  # made before the thread starts
            self.pool.submit(self.work, what, ident)

    def work(self, what: str, ident: int) -> None:

        close_old_connections()
        try:
            if what == "fan_out":
                for delivery_id in services.fan_out(ident):
                    self.submit("deliver", delivery_id)
            elif what == "deliver":
                delay = services.deliver(ident)
                if delay is not None:
                    self.submit("deliver", ident, delay)
            elif what == "verify":
                verification.send(ident)
            elif what == "recover":
                for delivery_id, delay in services.due_deliveries():
                    self.submit("deliver", delivery_id, delay)
        except Exception:
            logger.exception("notification work %s %s failed", what, ident)
        finally:
            # A pool thread keeps no connection between tasks (tests drop their databases).
            connection.close()
            with self.wake:
                self.busy -= 1
                self.wake.notify_all()

    def idle(self, timeout: float = 10.0) -> bool:
        """Wait until nothing is due now nor being sent (tests); whether it got there."""
        deadline = time.monotonic() + timeout
        with self.wake:
            while self.busy or (self.queue and self.queue[0][0] <= time.monotonic()):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.wake.wait(timeout=min(left, 0.05))
        return True

    def settle(self, timeout: float = 10.0) -> bool:
        """``idle``, then forget what is scheduled later (tests: retries due after a test would
        run against the next test's database). Whether it got idle."""
        idle = self.idle(timeout)
        with self.wake:
            self.queue.clear()
        return idle


worker = Worker()
