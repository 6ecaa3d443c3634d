"""An embedded console of its own for the bench: temporary var dir, SQLite, simulated nodes,
and the real embedded control loop thread (placement + the local node agent)."""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
import time
from pathlib import Path

from agent.runner import kill_unfinished_runs

REPO = Path(__file__).resolve().parents[2]


def configure_environment(*, var_dir: Path, poll_interval: float | None, health_interval: float | None, verbose: bool) -> None:
    """Point the settings at ``var_dir``; must run before ``django.setup()``."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "console.settings"
    os.environ["CONSOLE_VAR_DIR"] = str(var_dir)
    os.environ["SQLITE_PATH"] = str(var_dir / "console.sqlite3")
    os.environ["JOB_WORK_ROOT"] = str(var_dir / "jobs")
    # The images and the local registry (its credentials) are the checkout's, as `make run`'s: a
    # registry another engine root started refuses this one's pulls.
    os.environ.setdefault("CONTAINER_ENGINE_ROOT", str(REPO / "var" / "podman"))
    # Faults can only be injected into simulated GPUs: force them even on a machine with a driver.
    os.environ["SIMULATED_GPUS"] = "1"
    os.environ.setdefault("CONSOLE_ADMIN_PASSWORD", "bench-not-secret")
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REDIS_URL", None)
    if poll_interval is not None:
        os.environ["AGENT_POLL_INTERVAL"] = str(poll_interval)
    if health_interval is not None:
        os.environ["HEALTH_CHECK_INTERVAL"] = str(health_interval)
    if not verbose:
        os.environ.setdefault("LOG_LEVEL", "ERROR")


class EmbeddedConsole:
    """Sets up the database and nodes, starts the control loop, and cleans up everything it started."""

    def __init__(self, var_dir: Path) -> None:
        self.var_dir = var_dir
        self.loop = None
        self.user = None

    def start(self) -> None:
        import django

        django.setup()
        from django.contrib.auth import get_user_model
        from django.core.management import call_command

        from agent.backend import start_local_agent
        from agent.loop import EmbeddedControlLoop

        call_command("migrate", interactive=False, verbosity=0)
        call_command("bootstrap", stdout=io.StringIO())
        self.user = get_user_model().objects.create_user("bench", password=None)
        # Exactly what `make run` (runconsole) starts.
        self.loop = EmbeddedControlLoop(start_local_agent())
        self.loop.start()

    @property
    def interval(self) -> float:
        """The embedded loop's round interval without wake-ups (its rounds now run on events,
        with a slow safety sweep): the waits that allow for a round a fault may just miss."""
        from django.conf import settings  # here: this module is imported before django.setup()

        return settings.AGENT_POLL_INTERVAL

    def create_job(self, name: str, command: str, **fields):
        from django.conf import settings

        from jobs.services.creation import create_job

        return create_job(
            owner=self.user,
            name=name,
            image=settings.DEFAULT_IMAGE,
            command=command,
            gpus_per_node=1,
            node_count=1,
            failover_enabled=True,
            **fields,
        )

    def stop_job(self, job, *, timeout: float = 60.0) -> str:
        """Stop a job (if it still runs) and wait until it is no longer active."""
        from jobs.models import TrainingJob
        from jobs.services.actions import JobActionRefused, request_stop
        from jobs.statuses import ACTIVE

        with contextlib.suppress(JobActionRefused):
            request_stop(job, actor="bench", reason="bench run over")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            status = TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk)
            if status not in ACTIVE:
                return status
            time.sleep(0.05)
        return TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk)

    def use_backend(self, backend: str, cluster=None) -> None:
        """Serve the nodes through ``backend`` from now on ("agents", or "slurm" on ``cluster``, a
        started ``LocalSlurmCluster``): the loop is stopped and one on the new backend started,
        exactly as ``runconsole`` would with ``BACKEND`` set so."""
        from django.conf import settings

        from agent.backend import start_local_agent
        from agent.loop import EmbeddedControlLoop

        if self.loop is not None:
            self.loop.stop()
            self.loop.join(timeout=10)
        settings.BACKEND = backend
        if cluster is not None:
            from harness.slurm import use_cluster

            use_cluster(settings, cluster)
        self.loop = EmbeddedControlLoop(start_local_agent())
        self.loop.start()

    def shutdown(self) -> None:
        """Stop every job still active, stop the loop, and kill any run left behind."""
        try:
            from jobs.models import TrainingJob
            from jobs.statuses import ACTIVE

            for job in TrainingJob.objects.filter(status__in=ACTIVE):
                self.stop_job(job, timeout=20.0)
        except Exception as exc:  # the cleanup below still runs
            print(f"warning: could not stop the bench's jobs cleanly: {exc}")
        if self.loop is not None:
            self.loop.stop()
            self.loop.join(timeout=10)
        from django.conf import settings

        kill_unfinished_runs(Path(settings.JOB_WORK_ROOT))


def make_var_dir(keep: bool) -> Path:
    return Path(tempfile.mkdtemp(prefix="bench-failover-"))
