"""Where a run lives on its node and how to reach its processes.

Each rank of an attempt has a run directory in which ``agent.runner`` keeps the run files
(``agent.runfiles``: what to run, its processes, its output, how it ended).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path

import psutil
from django.conf import settings

from agent import cgroups, runfiles
from jobs.models import AttemptNode

logger = logging.getLogger(__name__)

RUNNER_MODULE = "agent.runner"


def run_dir(part: AttemptNode) -> Path:
    return Path(settings.JOB_WORK_ROOT).joinpath(*runfiles.run_dir_parts(part.attempt.job_id, part.attempt.number, part.rank))


def signal_run(part: AttemptNode, sig: int) -> bool:
    """Signal every process of a run; False if the run has not recorded its process group yet.

    A run is all of its processes, whatever session they moved to (torchrun's, DeepSpeed's and
    accelerate's workers start their own): each process descended from the run's group leader is
    signalled. In a container the leader is its init (``catatonit``), whose death ends the whole container, so a
    SIGTERM goes to the processes inside (the training can checkpoint) and a SIGKILL also to the
    leader and to everything in the run's cgroup (where the node gives it one). Works from any
    process of the machine the run is on (the agent, or the control plane for a simulated node).
    """
    record = runfiles.read_pid(run_dir(part))
    if record is None:
        return False
    pgid, container_pid = record.pgid, record.container_pid
    if pgid is None:
        logger.warning("job %s: no process group in the pid record of attempt %s rank %s", part.attempt.job_id, part.attempt.number, part.rank)
        return False
    in_container = container_pid is not None
    if container_pid is not None:
        # The container's init (its first process) and what it started; Podman's own processes
        # outside it are the leader's group, ended with a SIGKILL only.
        processes = run_processes(container_pid) if is_container_init(container_pid, record.started_at) else []
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
        own = [Path(d) for d in record.cgroup if cgroups.is_run_cgroup(d)]
        cgroups.kill_all(own)
        if container_pid is not None and processes:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(container_pid, signal.SIGKILL)  # the namespace's init: every process in it ends
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


def is_container_init(pid: int, started_at: float) -> bool:
    """Whether ``pid`` is still the run's container init (not a pid the system reused): it runs
    catatonit and started after the runner started the run (``started_at``)."""
    try:
        process = psutil.Process(pid)
        return is_sandbox(process) and process.create_time() >= started_at - 1
    except (psutil.NoSuchProcess, psutil.AccessDenied):
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
