"""Where a run lives on its node and how to reach its processes.

Each rank of an attempt has a run directory, ``<JOB_WORK_ROOT>/<job>/attempt-<n>/rank-<r>/``, in
which ``agent.runner`` keeps ``spec.json`` (what to run), ``pid.json`` (its process group),
``output.jsonl`` (the output, one record a line) and ``exit.json`` (how it ended).
"""
from __future__ import annotations

import json
import logging
import os
import signal
from pathlib import Path

import psutil
from django.conf import settings

from jobs.models import AttemptNode

logger = logging.getLogger(__name__)

RUNNER_MODULE = "agent.runner"


def job_dir(job_id: int) -> Path:
    return Path(settings.JOB_WORK_ROOT) / str(job_id)


def run_dir(part: AttemptNode) -> Path:
    return job_dir(part.attempt.job_id) / f"attempt-{part.attempt.number}" / f"rank-{part.rank}"


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def signal_run(part: AttemptNode, sig: int) -> bool:
    """Signal a run's process group by its pid.json; False if it has not recorded its group yet.

    Works from any process of the machine the run is on (the agent, or the control plane for a
    simulated node).
    """
    pid_info = read_json(run_dir(part) / "pid.json")
    if not pid_info:
        return False
    try:
        os.killpg(int(pid_info["pgid"]), sig)
        logger.info("job %s: sent %s to attempt %s rank %s", part.attempt.job_id, signal.Signals(sig).name, part.attempt.number, part.rank)
    except ProcessLookupError:
        pass
    except PermissionError:
        logger.warning("job %s: not allowed to signal process group %s", part.attempt.job_id, pid_info["pgid"])
    return True


def is_runner(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) supervisor of a run."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and RUNNER_MODULE in " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
