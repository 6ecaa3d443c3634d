"""Starting this agent's ranks of a placed attempt: claim each rank, resolve the image, build the
run's environment and start its detached supervisor (``agent.runner``)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from django.conf import settings
from django.db.models import Q

from agent import sandbox
from agent.processes import RUNNER_MODULE, is_runner, run_dir, signal_run
from jobs.models import AttemptNode, Image, JobAttempt, TrainingJob
from jobs.services import runs
from jobs.services.limits import limits_of
from jobs.services.paths import PathRefused, job_dir, output_dir_of, volumes_of

logger = logging.getLogger(__name__)


def vendor_dir() -> str:
    return str(Path(settings.BASE_DIR) / "ckptlib" / "vendor")


def runtime_python(runtime: str) -> Path:
    return Path(runtime) / "bin" / "python"


def latest_checkpoint_step(output_dir: str) -> int | None:
    """The step of the newest committed ckptlib checkpoint in a job's output directory."""
    from ckptlib import checkpoint_root, read_latest

    return read_latest(checkpoint_root(output_dir))


class SandboxUnavailable(RuntimeError):
    """Jobs must run sandboxed and this node cannot start a sandbox."""


def simulated_devices(node_name: str, gpu_count: int) -> Path:
    """A simulated node's stand-in device nodes (plain files), made on first use."""
    directory = Path(settings.SIMULATED_DEVICE_DIR) / node_name
    directory.mkdir(parents=True, exist_ok=True)
    for name in [f"nvidia{i}" for i in range(gpu_count)] + ["nvidiactl"]:
        (directory / name).touch(exist_ok=True)
    return directory


def sandbox_policy(job: TrainingJob, part: AttemptNode, runtime: str, workdir: Path, output_dir: str) -> dict | None:
    """What the run may see (``agent.sandbox``); None where an operator turned the sandbox off."""
    if settings.JOB_SANDBOX == "off":
        return None
    ready, why = sandbox.availability()
    if not ready:
        raise SandboxUnavailable(f"this node cannot sandbox jobs: {why}; install bubblewrap or set JOB_SANDBOX=off")
    user = job_user(job)
    if user is not None:
        for directory in (workdir, Path(output_dir)):
            os.chown(directory, user["uid"], user["uid"])
    node = part.node
    device_dir = simulated_devices(node.name, node.gpus.count()) if node.simulated else Path("/dev")
    volumes = volumes_of(job.project)
    hidden = {settings.VAR_DIR, settings.JOB_WORK_ROOT, settings.PROJECT_DATA_ROOT}
    return {
        "bwrap": sandbox.bwrap_path(),
        "hidden": sorted(str(Path(p).resolve()) for p in hidden),
        "readonly": [str(settings.BASE_DIR), runtime, interpreter_home(runtime), *(v.path for v in volumes if v.read_only)],
        "writable": [str(workdir), output_dir, *(v.path for v in volumes if not v.read_only)],
        "devices": sandbox.gpu_devices(part.gpu_indices, device_dir=str(device_dir)),
        "home": "/tmp",
        "user": user,
        # Ranks on several nodes meet over the network; one node's processes meet on loopback.
        "network": "host" if job.node_count > 1 or settings.JOB_NETWORK == "host" else "loopback",
    }


def run_limits(job: TrainingJob) -> dict:
    """The run's CPU and memory limits (``agent.cgroups``; None: unlimited, still its own cgroup)."""
    limits = limits_of(job)
    return {"cpus": limits.cpus, "memory_mb": limits.memory_mb, "cgroup_parent": settings.JOB_CGROUP_PARENT}


def interpreter_home(runtime: str) -> str:
    """Where the image's Python really lives (a virtualenv's python links to its base install)."""
    return str(Path(os.path.realpath(runtime_python(runtime))).parents[1])


def job_user(job: TrainingJob) -> dict | None:
    """The project's own unprivileged user, where the agent is root (None: the agent's user)."""
    if settings.JOB_USERS == "off" or os.geteuid() != 0:
        return None
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise SandboxUnavailable("setpriv (util-linux) is not installed, so jobs cannot run as their project's user")
    return {"uid": settings.JOB_UID_BASE + job.project_id, "name": f"job-{job.project.name}"[:32], "setpriv": setpriv}


def run_env(job: TrainingJob, attempt: JobAttempt, part: AttemptNode, runtime: str, output_dir: str) -> dict[str, str]:
    """The run's whole environment: the platform's defaults, the job's own variables, then what
    the platform sets for every run (its GPUs, ranks, checkpoint vendor, …), which a job cannot
    override."""
    workdir = job_dir(job.pk) / "work"
    env = {
        "PATH": f"{runtime}/bin:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
        "HOME": os.environ.get("HOME", str(workdir)),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        "VIRTUAL_ENV": runtime,
        # torch allocates large CPU tensors page-aligned (and on huge pages), so ckptlib
        # writes them to disk straight from memory; a job's own env may turn it off.
        "THP_MEM_ALLOC_ENABLE": "1",
        **job.env,
        "CUDA_VISIBLE_DEVICES": ",".join(map(str, part.gpu_indices)),
        "CHECKPOINT_VENDOR": vendor_dir(),
        "RANK": str(part.rank),
        "NODE_RANK": str(part.rank),
        "LOCAL_RANK": "0",
        "WORLD_SIZE": str(job.node_count),
        "MASTER_ADDR": attempt.master_addr,
        "MASTER_PORT": str(attempt.master_port),
        "JOB_NAME": job.name,
        "JOB_ID": str(job.pk),
        "JOB_ATTEMPT": str(attempt.number),
        "OUTPUT_DIR": output_dir,
    }
    if attempt.resume_step is not None:
        env["CKPT_LAST_STEP"] = str(attempt.resume_step)
    return env


class Launcher:
    """Per agent: starts ranks on its nodes and keeps their supervisors as children, reaped so no
    zombie lingers."""

    def __init__(self, node_names: list[str]) -> None:
        self.node_names = node_names
        self.children: dict[int, subprocess.Popen] = {}

    def launch(self, attempt: JobAttempt) -> list[AttemptNode]:
        """Start this agent's parts of a placed attempt; the last part started makes it Running.
        Returns the parts started here.

        Each part is claimed by compare-and-swap first, so a duplicate dispatch or two agents
        never start it twice.
        """
        if not runs.launchable(attempt):
            return []
        job = attempt.job
        image = Image.objects.filter(reference=job.image).first()
        if image is None or not runtime_python(image.runtime).exists():
            why = f"image {job.image} is not registered" if image is None else (
                f"image {job.image} cannot be resolved on the node: {runtime_python(image.runtime)} does not exist"
            )
            runs.image_unavailable(job, why)
            return []
        mine = list(
            attempt.placements.filter(node__name__in=self.node_names, runner_pid__isnull=True).select_related("node").order_by("rank")
        )
        claimed = [p for p in mine if AttemptNode.objects.filter(pk=p.pk, runner_pid__isnull=True).update(runner_pid=0)]
        if not claimed:
            return []
        try:
            output_dir = str(output_dir_of(job))
        except PathRefused as exc:
            runs.launch_failed(attempt, f"output directory refused: {exc}")
            return []
        if attempt.number > 1:
            attempt.resume_step = latest_checkpoint_step(output_dir)
            if claimed[0].rank == 0:
                JobAttempt.objects.filter(pk=attempt.pk).update(resume_step=attempt.resume_step)
        try:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            for part in claimed:
                part.attempt = attempt
                part.runner_pid = self.start_runner(job, attempt, part, image.runtime, output_dir)
        except SandboxUnavailable as exc:
            logger.error("job %s: %s", job.pk, exc)
            runs.launch_failed(attempt, str(exc))
            return []
        except OSError as exc:
            logger.exception("job %s: launch failed", job.pk)
            runs.launch_failed(attempt, str(exc))
            return []
        if attempt.placements.filter(Q(runner_pid__isnull=True) | Q(runner_pid=0)).exists():
            return claimed  # other agents still start their ranks
        attempt.refresh_from_db(fields=["resume_step"])
        if not runs.run_started(attempt):
            # The job was stopped while we launched: the agent's stop round terminates what we started.
            logger.info("job %s: stopped during launch; terminating attempt %s", job.pk, attempt.number)
        return claimed

    def start_runner(self, job: TrainingJob, attempt: JobAttempt, part: AttemptNode, runtime: str, output_dir: str) -> int:
        """Start the rank's detached supervisor; returns its pid (recorded on the part)."""
        directory = run_dir(part)
        directory.mkdir(parents=True, exist_ok=True)
        # Files of an earlier install reusing JOB_WORK_ROOT must not pass for this run's.
        for stale in ("pid.json", "exit.json", "output.jsonl"):
            (directory / stale).unlink(missing_ok=True)
        workdir = job_dir(job.pk) / "work"
        workdir.mkdir(parents=True, exist_ok=True)
        spec = {
            "command": job.command,
            "cwd": str(workdir),
            "env": run_env(job, attempt, part, runtime, output_dir),
            "max_line_chars": settings.LOG_MAX_LINE_CHARS,
            "sandbox": sandbox_policy(job, part, runtime, workdir, output_dir),
            "limits": run_limits(job),
        }
        spec_path = directory / "spec.json"
        # The spec holds the job's environment (its secrets): the agent's eyes only.
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(spec))
        with open(directory / "runner.log", "ab") as err:
            child = subprocess.Popen(
                [sys.executable, "-m", RUNNER_MODULE, str(spec_path)],
                cwd=str(settings.BASE_DIR),
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.children[child.pid] = child
        AttemptNode.objects.filter(pk=part.pk).update(runner_pid=child.pid, workdir=str(workdir))
        logger.info("job %s: attempt %s rank %s started on %s (runner %s)", job.pk, attempt.number, part.rank, part.node.name, child.pid)
        return child.pid

    # --- the process layer (a simulated fleet replaces these: ``bench.scale.fleet``) ------------
    def alive(self, pid: int) -> bool:
        """Whether a run's supervisor still runs."""
        return is_runner(pid)

    def signal(self, part: AttemptNode, sig: int) -> bool:
        """Signal every process of a run; False if it has not recorded its processes yet."""
        return signal_run(part, sig)

    def reap(self) -> None:
        for pid, child in list(self.children.items()):
            if child.poll() is not None:
                del self.children[pid]
