"""The embedded console's writers share one SQLite file: the control round, the agent's reports
(its launches' ``part_started`` among them), its heartbeats, the health monitor's readings, the log
ingest and the web API, each on a thread of its own here as in ``manage.py runconsole``. Every
transaction takes the write lock at BEGIN (``IMMEDIATE``) and waits for it (the busy timeout), so
they queue instead of failing: no "database is locked", no "database table is locked"."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest
from django.db import connections
from django.utils import timezone

from failover.probes import probe_for
from failover.services.health import record_health
from harness.api import JOBS_URL
from jobs.backends.facts import exited
from jobs.models import JobAttempt, Node, TrainingJob
from jobs.services.control import control_round
from jobs.services.runs import claim_parts, part_exited, part_started
from jobs.statuses import JobStatus
from logs.models import LogLine
from logs.services import RawLine, ingest_lines

pytestmark = [pytest.mark.slow, pytest.mark.database, pytest.mark.django_db(transaction=True)]

JOBS = 60  # three nodes of four GPUs hold twelve at once: five waves of placement
LINES = 20  # per batch of the log flood


class Writers:
    """Threads that each repeat one writer's step until stopped; the first error stops them all."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.errors: list[str] = []
        self.steps: dict[str, int] = {}
        self.threads: list[threading.Thread] = []

    def start(self, name: str, step: Callable[[], bool | None]) -> None:
        """``step()`` again and again; a step that returns True is the writer's last."""

        def run() -> None:
            try:
                while not self.stop.is_set():
                    self.steps[name] = self.steps.get(name, 0) + 1
                    if step():
                        return
            except Exception as exc:
                self.errors.append(f"{name}: {exc!r}")
                self.stop.set()
            finally:
                connections.close_all()

        thread = threading.Thread(target=run, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        assert not [t.name for t in self.threads if t.is_alive()]


def test_the_control_round_the_agent_the_monitor_a_log_flood_and_an_api_burst_write_at_once_without_a_lock_error(owner_api, nodes, tmp_path, settings):
    settings.QUEUE_MAX_WAITING_PER_USER = JOBS  # the burst may outrun placement
    names = [n.name for n in nodes]
    created: list[int] = []
    started: dict[int, JobAttempt] = {}  # attempt id → the attempt, Running by the agent's report
    lines: dict[int, int] = {}  # attempt id → lines of it ingested

    def api_burst() -> bool:
        response = owner_api.post(JOBS_URL, {"name": f"burst-{len(created)}", "command": "python -c 'print(1)'"}, format="json")
        assert response.status_code == 201, response.content
        created.append(response.json()["id"])
        return len(created) == JOBS

    def control() -> None:
        control_round()

    def agent() -> None:
        """One pass of a node agent: beat, end the runs whose output was stored, start what was placed."""
        Node.objects.filter(name__in=names).update(last_heartbeat=timezone.now())
        for attempt_id in [a for a in started if a in lines]:
            for part in started.pop(attempt_id).placements.select_related("node"):
                part_exited(part, exited(0, None))
        for attempt in JobAttempt.objects.filter(state=JobAttempt.State.PLACED).select_related("job"):
            for part in claim_parts(attempt, names):
                part_started(part, runner_pid=os.getpid(), workdir=str(tmp_path / str(part.pk)))
            started[attempt.pk] = attempt

    def log_flood() -> None:
        for attempt in JobAttempt.objects.filter(state=JobAttempt.State.RUNNING):
            first = lines.get(attempt.pk, 0) + 1
            batch = [RawLine(first + i, time.time(), f"step {first + i} loss 0.5") for i in range(LINES)]
            ingest_lines(job_id=attempt.job_id, stream="master", attempt=attempt.number, lines=batch)
            lines[attempt.pk] = first + LINES - 1

    def health_monitor() -> None:
        for node in Node.objects.filter(name__in=names):
            probe = probe_for(node)
            record_health(node, probe.check(), probe.kernel_log(), probe.gpu_by_pci())

    writers = Writers()
    for name, step in [("api", api_burst), ("control", control), ("agent", agent), ("logs", log_flood), ("monitor", health_monitor)]:
        writers.start(name, step)
    try:
        deadline = time.monotonic() + 240
        # The test's own reads go on meanwhile, as the pages' do.
        while not writers.stop.is_set() and TrainingJob.objects.filter(status=JobStatus.COMPLETED).count() < JOBS:
            assert time.monotonic() < deadline, (
                f"{TrainingJob.objects.filter(status=JobStatus.COMPLETED).count()} of {JOBS} jobs completed; steps {writers.steps}"
            )
            time.sleep(0.1)
    finally:
        writers.join()
    assert writers.errors == []
    assert len(created) == JOBS and TrainingJob.objects.filter(status=JobStatus.COMPLETED).count() == JOBS
    assert LogLine.objects.count() >= JOBS * LINES  # every run's output was stored while the others wrote
    assert min(writers.steps.values()) > 1
