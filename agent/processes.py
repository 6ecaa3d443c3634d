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

from agent import cgroups
from jobs.models import AttemptNode
from jobs.services.paths import job_dir

logger = logging.getLogger(__name__)

RUNNER_MODULE = "agent.runner"


def run_dir(part: AttemptNode) -> Path:
    return job_dir(part.attempt.job_id) / f"attempt-{part.attempt.number}" / f"rank-{part.rank}"


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def signal_run(part: AttemptNode, sig: int) -> bool:
    """Signal every process of a run; False if the run has not recorded its process group yet.

    A run is all of its processes, whatever session they moved to (torchrun's, DeepSpeed's and
    accelerate's workers start their own): each process descended from the run's group leader is
    signalled. In a container the leader is its init (``catatonit``), whose death ends the whole container, so a
    SIGTERM goes to the processes inside (the training can checkpoint) and a SIGKILL also to the
    leader and to everything in the run's cgroup (where the node gives it one). Works from any
    process of the machine the run is on (the agent, or the control plane for a simulated node).
    """
    pid_info = read_json(run_dir(part) / "pid.json")
    if not pid_info:
        return False
    try:
        pgid = int(pid_info["pgid"])
    except (KeyError, TypeError, ValueError):
        logger.warning("job %s: unreadable pid.json of attempt %s rank %s", part.attempt.job_id, part.attempt.number, part.rank)
        return False
    container_pid = pid_info.get("container_pid")
    in_container = isinstance(container_pid, int) and not isinstance(container_pid, bool) and container_pid > 1
    if in_container:
        # The container's init (its first process) and what it started; Podman's own processes
        # outside it are the leader's group, ended with a SIGKILL only.
        processes = run_processes(container_pid) if is_container_init(container_pid, pid_info) else []
    else:
        processes = run_processes(pgid)
    in_sandbox = in_container or (bool(processes) and is_sandbox(processes[-1]))  # the group leader comes last
    for process in processes:
        if sig != signal.SIGKILL and in_sandbox and spared_from_term(process):
            continue
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
        except psutil.AccessDenied:
            logger.warning("job %s: not allowed to signal process %s", part.attempt.job_id, process.pid)
    if sig == signal.SIGKILL:
        # The run's cgroup holds every process of it, whatever it forked or where it moved.
        own = [Path(d) for d in pid_info.get("cgroup") or () if isinstance(d, str) and cgroups.is_run_cgroup(d)]
        cgroups.kill_all(own)
        if in_container and processes:
            try:
                os.kill(container_pid, signal.SIGKILL)  # the namespace's init: every process in it ends
            except (ProcessLookupError, PermissionError):
                pass
    if sig == signal.SIGKILL or not in_sandbox:
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            pass
        except PermissionError:
            logger.warning("job %s: not allowed to signal process group %s", part.attempt.job_id, pgid)
    logger.info("job %s: sent %s to attempt %s rank %s", part.attempt.job_id, signal.Signals(sig).name, part.attempt.number, part.rank)
    return True


def run_processes(pgid: int) -> list[psutil.Process]:
    """The run's group leader and every process descended from it (children first)."""
    try:
        leader = psutil.Process(pgid)
        return [*leader.children(recursive=True), leader]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def is_container_init(pid: int, pid_info: dict) -> bool:
    """Whether ``pid`` is still the run's container init (not a pid the system reused): it runs
    catatonit and started after the runner."""
    try:
        process = psutil.Process(pid)
        started = float(pid_info.get("started_at") or 0)
        return is_sandbox(process) and process.create_time() >= started - 1
    except (psutil.NoSuchProcess, psutil.AccessDenied, TypeError, ValueError):
        return False


def is_sandbox(process: psutil.Process) -> bool:
    """The container's init (``catatonit``, mounted by Podman's ``--init`` as ``podman-init``)."""
    try:
        return process.name() in ("catatonit", "podman-init")
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def spared_from_term(process: psutil.Process) -> bool:
    """The container's init and the command's own shell: the container ends when its first
    process exits, so they must outlive the training processes a SIGTERM asks to checkpoint and
    exit."""
    if is_sandbox(process):
        return True
    try:
        parent = process.parent()
        return process.name() == "bash" and parent is not None and is_sandbox(parent)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def is_runner(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) supervisor of a run."""
    try:
        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE and RUNNER_MODULE in " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
