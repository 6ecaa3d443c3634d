"""Starting this agent's ranks of a placed attempt: claim each rank, pull the image, make the
run's directories, build its environment and start its detached supervisor (``agent.runner``).

What the agent finds on the way (the ranks it claimed, the image's digest, the newest checkpoint,
the supervisor's pid) it reports to the control plane (``jobs.services.runs``), which decides what
it means for the attempt and the job; the agent writes no job, attempt or rank itself. The image
is checked here, once, by pulling it: placement does not look at it."""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from django.conf import settings

from agent import checkpointless, engine, inputs, networks, resume, runfiles, sandbox, uids, workdirs
from agent.ports import LaunchPort, RunAccount
from agent.processes import RUNNER_MODULE, is_runner, signal_run
from agent.runfiles import RunSpec
from agent.sandbox import ContainerPolicy, RunLimits
from jobs.models import AttemptNode, JobAttempt, TrainingJob
from jobs.secret_env import SecretUnreadable
from jobs.services import images, runs
from jobs.services.capacity import job_network
from jobs.services.limits import limits_of
from jobs.services.paths import OutputLocation, PathRefused, job_dir, output_location, volumes_of

logger = logging.getLogger(__name__)

# Where a project volume may not be mounted in a container: over these directories, or below the
# platform's own.
RESERVED_TARGETS = ("/", "/proc", "/sys", "/dev", "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib64", "/run", "/tmp", "/job", "/opt/ckptlib")
PLATFORM_TREES = ("/proc", "/sys", "/dev", "/job", "/opt/ckptlib")


def vendor_dir() -> str:
    return str(Path(settings.BASE_DIR) / "ckptlib" / "vendor")


def resume_point(job: TrainingJob, location: OutputLocation, *, contained: bool) -> resume.ResumePoint | None:
    """The checkpoint a re-placed run resumes from: the newest committed one on disk among those
    its commit lines reported in its own storage and its output directory (``agent.resume``)."""
    return resume.resume_point(job, location, contained=contained)


def engine_root() -> Path:
    return Path(settings.CONTAINER_ENGINE_ROOT)


def engine_env() -> dict[str, str]:
    """Podman's whole environment for this node's runs and pulls (its configuration files; none
    of the caller's variables)."""
    return engine.clean_env(engine_root())


def containers_ready() -> tuple[bool, str]:
    ready, why = engine.availability(engine_root())
    return ready, ("" if ready else why)


def simulated_devices(node_name: str, gpu_count: int) -> Path:
    """A simulated node's stand-in device nodes (plain files), made on first use."""
    directory = Path(settings.SIMULATED_DEVICE_DIR) / node_name
    directory.mkdir(parents=True, exist_ok=True)
    for name in [f"nvidia{i}" for i in range(gpu_count)] + ["nvidiactl"]:
        (directory / name).touch(exist_ok=True)
    return directory


def run_uid(job: TrainingJob) -> int | None:
    """The project's own unprivileged uid on this node (None where the agent is not root)."""
    if os.geteuid() != 0:
        return None
    install = uids.install_id(Path(settings.VAR_DIR))
    return uids.uid_for(Path(settings.JOB_UID_REGISTRY), install, job.project_id, settings.JOB_UID_RANGE)


class NetworkRefused(PathRefused):
    """The project's current settings do not allow the network its placed ranks need."""


def mountable(path: str) -> str:
    """A host path Podman's ``--mount`` can name (its options are comma-separated)."""
    if "," in path or "\n" in path:
        raise PathRefused(f"{path!r} cannot be mounted: it holds a comma or a newline")
    return path


class RunDirectories(TypedDict):
    """A run's directories on the host (``LocalLauncher.make_directories``)."""

    work: Path
    output: Path
    output_mount: bool  # the output directory is mounted on its own
    output_in_run: str  # its path as the run sees it
    fence: NotRequired[Path]  # the attempt's fence file's directory, once written
    inputs: NotRequired[Path]  # the job's staged code and warm-start checkpoint (agent.inputs)
    setup: NotRequired[list[str]]  # the shell lines that put them in place in the run
    resume_env: NotRequired[dict[str, str]]  # where a replica it resumes from is (agent.checkpointless)


def container_policy(
    job: TrainingJob, attempt: JobAttempt, part: AttemptNode, image_ref: str, dirs: RunDirectories, uid: int | None, *, account: RunAccount | None = None
) -> ContainerPolicy:
    """What the run's container is: its image by digest, its mounts (an allow-list), devices,
    user, network and limits (``agent.sandbox.container_argv``); ``account``: started rootless
    by a scheduler's unprivileged account (``agent.rootless``)."""
    node = part.node
    agents = set(AttemptNode.objects.filter(attempt=attempt).values_list("node__agent", flat=True))
    network, refusal = job_network(job.project, agents, job.node_count)
    if refusal:
        raise NetworkRefused(f"the job cannot start: {refusal}")
    mounts = [[mountable(str(dirs["work"])), sandbox.WORK_DIR, "rw"]]
    if dirs["output_mount"]:
        mounts.append([mountable(str(dirs["output"])), sandbox.OUTPUT_DIR, "rw"])
    mounts.append([mountable(str(dirs["fence"])), sandbox.FENCE_DIR, "ro"])
    if "inputs" in dirs:
        mounts.append([mountable(str(dirs["inputs"])), inputs.IN_RUN, "ro"])
    mounts.append([mountable(str(Path(settings.BASE_DIR) / "ckptlib")), f"{sandbox.CKPTLIB_ROOT}/ckptlib", "ro"])
    for volume in volumes_of(job.project):
        if volume.path in RESERVED_TARGETS or volume.path.startswith(tuple(t + "/" for t in PLATFORM_TREES)):
            raise PathRefused(f"volume {volume.path} would cover a system directory of the container")
        mounts.append([mountable(volume.path), volume.path, "ro" if volume.read_only else "rw"])
    if node.simulated:
        device_dir = simulated_devices(node.name, node.gpus.count())
        for host, inside in sandbox.gpu_devices(part.gpu_indices, device_dir=str(device_dir)):
            mounts.append([mountable(host), inside, "ro"])
        devices = []
    else:
        devices = sandbox.gpu_devices(part.gpu_indices, device_dir=None)
    policy: ContainerPolicy = {
        "podman": sandbox.podman_path(),
        "engine_env": engine_env(),
        "image": image_ref,
        # Unique on the node: consoles, jobs, attempts and ranks, and a fresh suffix per start.
        "name": f"{container_prefix()}{job.pk}-{attempt.number}-{part.rank}-{secrets.token_hex(3)}",
        "user": uid if uid is not None else os.geteuid(),
        "mounts": mounts,
        "devices": devices,
        "workdir": sandbox.WORK_DIR,
        "pids_limit": settings.JOB_PIDS_LIMIT,
        "network": network,
        "job_network": {
            # This console's, this job's (a job id is used again by another database) and attempt's.
            "name": f"{container_prefix()}{job.pk}-{attempt.number}-{zlib.crc32(repr(job.created_at.timestamp()).encode()):08x}",
            "rank": part.rank,
            "egress": job.project.effective_egress,
            "pool": settings.JOB_NETWORK_POOL,
            "deny": egress_deny(),
        },
        "hostname": node.name,
        "labels": {"io.satrain.job": job.pk, "io.satrain.attempt": attempt.number, "io.satrain.rank": part.rank},
    }
    if account is not None:
        registry, _ = engine.split_reference(image_ref)
        policy["rootless"] = {
            "storage": account.storage,
            "tls_verify": registry not in engine.EngineConfig(engine_root()).local_registries(),
            "ranks": job.node_count,
        }
    return policy


def pull_auth(job: TrainingJob, image_ref: str) -> dict[str, Any]:
    """The credentials a rank pulling ``image_ref`` on its node gets: the platform's for its own
    local registry, else the project's (``images.auth_for``), else none."""
    registry, _ = engine.split_reference(image_ref)
    platform = engine.EngineConfig(engine_root()).platform_auths()
    if registry in platform:
        return {"auths": {registry: platform[registry]}}
    return images.auth_for(job) or {"auths": {}}


def egress_deny() -> list[str]:
    """The ranges an ``outbound`` job never reaches (JOB_EGRESS_DENY)."""
    return [d.strip() for d in settings.JOB_EGRESS_DENY.split(",") if d.strip()]


def container_prefix() -> str:
    """What this console's containers' and job networks' names start with on the node."""
    return f"sac-{uids.install_id(Path(settings.VAR_DIR))}-"


def sweep_strays(live: set[str]) -> tuple[int, int]:
    """At an agent's start: install the node's job network rules with this agent's settings, and
    remove this console's containers no live run holds (a runner killed
    outright leaves its container, its secrets file and its writable layer) and its job networks
    no container is in. Returns how many of each were removed."""
    if settings.JOB_SANDBOX == "off" or not sandbox.podman_path():
        return 0, 0
    podman, env, prefix = str(sandbox.podman_path()), sandbox.root_tool_env(engine_env()), container_prefix()
    try:
        # The node's job network rules follow the settings this agent starts with.
        networks.ensure_rules(settings.JOB_NETWORK_POOL, egress_deny(), env, replace=True)
    except (networks.NetworkUnavailable, OSError, ValueError, subprocess.SubprocessError) as exc:
        logger.error("the node's job network rules could not be installed: %s", exc)
    try:
        listed = subprocess.run([podman, "ps", "-a", "--format", "{{.Names}}"], check=False, env=env, capture_output=True, text=True, timeout=120)
        names = [n for n in listed.stdout.split() if n.startswith(prefix) and n not in live]
        for name in names:
            sandbox.remove_container(podman, name, env)
            sandbox.remove_secret_env(name)
        listed = subprocess.run([podman, "network", "ls", "--format", "{{.Name}}"], check=False, env=env, capture_output=True, text=True, timeout=120)
        removed = 0
        for name in [n for n in listed.stdout.split() if n.startswith(prefix)]:
            removed += networks.remove_unused(name, podman=podman, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("sweeping stray containers failed: %s", exc)
        return 0, 0
    if names or removed:
        logger.info("removed %d stray container(s) and %d job network(s) left by runs that ended", len(names), removed)
    return len(names), removed


def run_limits(job: TrainingJob) -> RunLimits:
    """The run's CPU, memory and PID limits (``agent.cgroups``; None: unlimited, still its own cgroup)."""
    limits = limits_of(job)
    pids = settings.JOB_PIDS_LIMIT + 256 if settings.JOB_SANDBOX != "off" else None  # Podman's own threads too
    return {
        "cpus": limits.cpus,
        "memory_mb": limits.memory_mb,
        "pids": pids,
        "cgroup_parent": settings.JOB_CGROUP_PARENT,
        # Podman's --cgroup-parent is one path for every v1 controller.
        "same_path": settings.JOB_SANDBOX != "off",
    }


def run_env(
    job: TrainingJob,
    attempt: JobAttempt,
    part: AttemptNode,
    output_dir: str,
    *,
    contained: bool,
    resume_step: int | None = None,
    fence: str = "",
) -> dict[str, str]:
    """The run's whole environment: the platform's defaults, the job's own variables, then what
    the platform sets for every run (its GPUs, ranks, checkpoint vendor, the checkpoint step it
    resumes from, …), which a job cannot override. In a container the image's own ``PATH`` stays."""
    workdir = job_dir(job.pk) / "work"
    env = {
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        # torch allocates large CPU tensors page-aligned (and on huge pages), so ckptlib
        # writes them to disk straight from memory; a job's own env may turn it off.
        "THP_MEM_ALLOC_ENABLE": "1",
    }
    if not contained:
        env["PATH"] = f"{Path(sys.prefix) / 'bin'}:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}"
        env["HOME"] = os.environ.get("HOME", str(workdir))
    env.update(job.env)
    for name in job.secret_env.names:
        env.pop(name, None)  # the secret's value reaches the run by its own path (run_secrets)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, part.gpu_indices)),
            "CHECKPOINT_VENDOR": sandbox.VENDOR_DIR if contained else vendor_dir(),
            "RANK": str(part.rank),
            "NODE_RANK": str(part.rank),
            "WORLD_SIZE": str(job.node_count),
            "MASTER_ADDR": attempt.master_addr,
            "MASTER_PORT": str(attempt.master_port),
            "JOB_NAME": job.name,
            "JOB_ID": str(job.pk),
            "JOB_ATTEMPT": str(attempt.number),
            "OUTPUT_DIR": output_dir,
        }
    )
    if job.node_count > 1:
        # One rank per node. A one-rank job gets none, as `python train.py` on a workstation:
        # with LOCAL_RANK set, accelerate and the Trainer start a process group of one (c10d
        # warnings about the master's name, "parallel_mode != DISTRIBUTED") for nothing.
        env["LOCAL_RANK"] = "0"
    if fence:
        env["JOB_FENCE"] = fence  # ckptlib commits only while it names this attempt (docs/failover.md)
    if resume_step is not None:
        env["CKPT_LAST_STEP"] = str(resume_step)
    return env


def run_secrets(job: TrainingJob, env: dict[str, str]) -> dict[str, str]:
    """The job's secret variables, decrypted only here, for the run alone: never a name the
    platform sets (``env`` holds them). The runner hands them to the run without writing them
    where they outlive it (``agent.sandbox.write_secret_env``)."""
    return {name: value for name, value in job.secret_env.reveal().items() if name not in env}


PULL_LINES_KEPT = 20  # of Podman's progress lines, shown in the run's log


def pull_image(job: TrainingJob, attempt: JobAttempt, progress: Callable[[str], None] | None = None) -> tuple[engine.PullResult, str]:
    """Pull the attempt's image (a failover's: the digest the first attempt ran) with the
    project's credentials, handed to Podman as an auth file only the agent can read. Returns the
    outcome and the reference that names exactly what was pulled (``repository@sha256:…``);
    ``progress`` gets Podman's progress lines."""
    first = JobAttempt.objects.filter(job=job, number__lt=attempt.number).exclude(image_digest="").order_by("number").first()
    reference = first.image_digest if first is not None else images.qualify(job.image)
    auth = images.auth_for(job)
    engine_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pull-", dir=engine_root()) as scratch:
        auth_file = None
        if auth is not None:
            auth_file = Path(scratch) / "auth.json"
            fd = os.open(auth_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump(auth, fh)
        result = engine.pull(engine_root(), reference, auth_file, timeout=settings.IMAGE_PULL_TIMEOUT, progress=progress)
    if result.ok and result.digest and "@" not in reference:
        return result, images.by_digest(reference, result.digest)
    return result, reference


def preamble(job: TrainingJob, part: AttemptNode, image_ref: str, pull_lines: Sequence[str] = ()) -> list[str]:
    """The lines the log shows while the run's environment is prepared, as the service's guide
    shows them ("환경 준비 상태"): the pull's progress, the image by digest, ckptlib, ready."""
    digest = image_ref.rpartition("@")[2]
    lines = [f"[console] pull: {line}" for line in list(pull_lines)[-PULL_LINES_KEPT:]]
    lines.append(f"[console] image {job.image} pulled ({digest})")
    if part.gpu_indices and not part.node.simulated and not sandbox.cdi_spec_present():
        lines.append(
            "[console] this node has no CDI spec for NVIDIA GPUs (nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml): "
            "the run gets only the /dev/nvidia<N> device nodes that exist, without the driver's libraries"
        )
    lines += [
        f"[INFO] Concurrent Checkpoint library is installed ({sandbox.VENDOR_DIR})",
        "[console] environment ready: starting the command",
    ]
    return lines


class Launcher:
    """Per agent: starts ranks on its nodes and keeps their supervisors as children, reaped so no
    zombie lingers. With a ``port`` (``agent.ports.LaunchPort``: a cluster's scheduler, e.g.
    ``agent.slurm.SlurmLaunch``), the port starts and signals the ranks' runners instead."""

    def __init__(self, node_names: Sequence[str], *, port: LaunchPort | None = None) -> None:
        self.node_names = node_names
        self.port = port
        self.children: dict[int, subprocess.Popen[bytes]] = {}
        self.pull_lines: dict[int, list[str]] = {}  # the last pull's progress, by attempt

    @property
    def account(self) -> RunAccount | None:
        """The unprivileged account the port's scheduler runs the ranks as (None: this agent's user)."""
        return self.port.account() if self.port is not None else None

    def launch(self, attempt: JobAttempt) -> list[AttemptNode]:
        """Start this agent's parts of a placed attempt; the control plane makes it Running when
        its last part has started (``runs.part_started``). Returns the parts started here.

        Each part is claimed by compare-and-swap first (``runs.claim_parts``), so a duplicate
        launch or two agents never start it twice.
        """
        if not runs.abandon_unless_waiting(attempt):
            return []
        job = attempt.job
        contained = settings.JOB_SANDBOX != "off"
        claimed = runs.claim_parts(attempt, self.node_names)
        if not claimed:
            return []
        image_ref = ""
        if contained:
            ready, why = self.containers_ready()
            if not ready:
                logger.error("job %s: this node cannot run containers: %s", job.pk, why)
                runs.launch_failed(attempt, f"this node cannot run containers: {why}")
                return []
            pulled, image_ref = self.pull(job, attempt)
            if not pulled.ok:
                runs.image_unavailable(attempt, claimed, f"image {job.image} could not be pulled: {pulled.message}")
                return []
            runs.image_pulled(attempt, claimed[0], image_ref)
        account = self.account
        try:
            location = output_location(job)
            # A scheduler's account runs the ranks: the directories are its (its containers map
            # their user to it); else the project's own uid on this node.
            uid = account.uid if account is not None else (run_uid(job) if contained else None)
            dirs = self.make_directories(job, location, uid, contained=contained)
        except (PathRefused, workdirs.DirectoryRefused, uids.NoFreeUid, ValueError) as exc:
            runs.launch_failed(attempt, f"output directory refused: {exc}")
            return []
        # The fence moves to this attempt before its resume step is chosen: from here on a run of
        # an earlier attempt still going on a node taken as lost commits nothing over what we read.
        try:
            identity = f"{uids.install_id(Path(settings.VAR_DIR))}-{job.created_at.timestamp():.6f}"
            dirs["fence"] = workdirs.write_fence(Path(settings.JOB_WORK_ROOT), job.pk, attempt.number, identity)
        except OSError as exc:
            runs.launch_failed(attempt, f"the job's fence could not be written: {exc}")
            return []
        point = resume_point(job, location, contained=contained) if attempt.number > 1 else None
        try:
            # The newest of the disk checkpoint and the in-memory replicas; then the code bundle,
            # and a warm start's checkpoint while the job has none of its own.
            chosen = checkpointless.choose(job, attempt, claimed, point.step if point else None, contained=contained, use_replicas=self.port is None)
            warm = chosen.step is None
            staged = inputs.stage(job, location, sandbox.WORK_DIR if contained else str(dirs["work"]), contained=contained, warm=warm)
        except (inputs.InputRefused, checkpointless.ReplicaRefused) as exc:
            runs.launch_failed(attempt, f"the run's inputs could not be prepared: {exc}")
            return []
        dirs["setup"] = chosen.setup + staged.setup
        if staged.directory is not None or chosen.env:
            dirs["inputs"], dirs["resume_env"] = inputs.inputs_path(job), chosen.env
        resume_step = chosen.step if not warm else staged.resume_step
        started = True
        for part in claimed:
            part.attempt = attempt
        try:
            if self.port is not None:
                # The whole attempt to the cluster's scheduler at once (one Slurm job, its ranks
                # started together): each rank's start is reported when seen (agent.slurm).
                ranks = [(part, *self.prepare_run(job, attempt, part, dirs, image_ref=image_ref, uid=uid, resume_step=resume_step)) for part in claimed]
                self.port.submit(job, attempt, ranks, workdir=str(dirs["work"]), resume_step=resume_step)
                return claimed
            for part in claimed:
                pid = self.start_runner(job, attempt, part, dirs, image_ref=image_ref, uid=uid, resume_step=resume_step)
                logger.info("job %s: attempt %s rank %s started on %s (runner %s)", job.pk, attempt.number, part.rank, part.node.name, pid)
                started = runs.part_started(part, runner_pid=pid, workdir=str(dirs["work"]), resume_step=resume_step) and started
        except (PathRefused, SecretUnreadable) as exc:
            logger.error("job %s: %s", job.pk, exc)
            runs.launch_failed(attempt, str(exc))
            return []
        except OSError as exc:
            logger.exception("job %s: launch failed", job.pk)
            runs.launch_failed(attempt, str(exc))
            return []
        if not started:
            # The job was stopped while we launched: the agent's stop round terminates what we
            # started. Ranks the control plane already ended (their node was taken as lost) are
            # no live run of ours: end them now.
            logger.info("job %s: stopped during launch; terminating attempt %s", job.pk, attempt.number)
            for part in AttemptNode.objects.filter(pk__in=[p.pk for p in claimed], ended_at__isnull=False).select_related("attempt"):
                self.signal(part, signal.SIGKILL)
        return claimed

    @staticmethod
    def make_directories(job: TrainingJob, location: OutputLocation, uid: int | None, *, contained: bool) -> RunDirectories:
        """The run's work and output directories, made through descriptors below directories the
        agent owns (``agent.workdirs``), each owned by the project's uid. Returns their host
        paths, whether the output directory is mounted on its own, and its path in the run."""
        work_root = Path(settings.JOB_WORK_ROOT)
        work = workdirs.make_leaf(work_root, [str(job.pk), "work"], uid=uid)
        if location.in_volume:
            # The volume is the project's, mounted whole: its jobs make what they need in it.
            return {"work": work, "output": location.path, "output_mount": False, "output_in_run": str(location.path)}
        output = workdirs.make_leaf(location.root, list(location.parts), uid=uid)
        return {"work": work, "output": output, "output_mount": contained, "output_in_run": sandbox.OUTPUT_DIR if contained else str(output)}

    def start_runner(
        self,
        job: TrainingJob,
        attempt: JobAttempt,
        part: AttemptNode,
        dirs: RunDirectories,
        *,
        image_ref: str,
        uid: int | None,
        resume_step: int | None = None,
    ) -> int:
        """Start the rank's detached supervisor on its spec (``agent.runfiles``); returns its pid."""
        directory, spec_path = self.prepare_run(job, attempt, part, dirs, image_ref=image_ref, uid=uid, resume_step=resume_step)
        return self.spawn(job, attempt, part, directory, spec_path)

    def prepare_run(
        self,
        job: TrainingJob,
        attempt: JobAttempt,
        part: AttemptNode,
        dirs: RunDirectories,
        *,
        image_ref: str,
        uid: int | None,
        resume_step: int | None = None,
    ) -> tuple[Path, Path]:
        """The rank's run directory and the spec its supervisor runs (``agent.runfiles``)."""
        work_root = Path(settings.JOB_WORK_ROOT)
        account = self.account
        owner = account.uid if account is not None else None
        directory = workdirs.make_private(work_root, runfiles.run_dir_parts(job.pk, attempt.number, part.rank), owner=owner)
        runfiles.clear_stale(directory)
        contained = bool(image_ref)
        command = job.command
        if contained and not dirs["output_mount"]:
            # An output directory in a writable volume: made by the run itself, as its own user.
            command = 'mkdir -p -- "$OUTPUT_DIR" 2>/dev/null\n' + command
        if dirs.get("setup"):
            command = "\n".join(dirs["setup"]) + "\n" + command
        env = run_env(
            job,
            attempt,
            part,
            dirs["output_in_run"],
            contained=contained,
            resume_step=resume_step,
            fence=f"{sandbox.FENCE_DIR}/{workdirs.FENCE_FILE}" if contained else str(dirs["fence"] / workdirs.FENCE_FILE),
        )
        snapshot_env, snapshot_mount = checkpointless.run_snapshot(job, part, uid, contained=contained) if self.port is None else ({}, None)
        env.update({**snapshot_env, **dirs.get("resume_env", {})})
        policy = container_policy(job, attempt, part, image_ref, dirs, uid, account=account) if contained else None
        if policy is not None and snapshot_mount is not None:
            policy["mounts"].append(snapshot_mount)
        spec = RunSpec(
            command=command,
            cwd=str(dirs["work"]),
            env=env,
            secret_env=run_secrets(job, env),
            max_line_chars=settings.LOG_MAX_LINE_CHARS,
            max_lines=settings.LOG_MAX_LINES_PER_JOB,
            max_bytes=settings.LOG_MAX_BYTES_PER_JOB,
            tail_lines=settings.LOG_TAIL_LINES,
            container=policy,
            # A scheduler's account: the scheduler enforces the job's limits (its cgroups).
            limits=run_limits(job) if account is None else None,
            preamble=preamble(job, part, image_ref, self.pull_lines.get(attempt.pk, ())) if contained else [],
        )
        if account is not None and contained:
            # The rank pulls its image on its node, as the account (agent.rootless.pull).
            runfiles.write_private(directory / runfiles.PULL_AUTH_FILE, json.dumps(pull_auth(job, image_ref)), owner=owner)
        return directory, runfiles.write_spec(directory, spec, owner=owner)

    def spawn(self, job: TrainingJob, attempt: JobAttempt, part: AttemptNode, directory: Path, spec_path: Path) -> int:
        """Start ``agent.runner`` on the spec, detached; its pid."""
        with runfiles.open_runner_log(directory) as err:
            child = subprocess.Popen(
                [sys.executable, "-m", RUNNER_MODULE, str(spec_path)],
                cwd=str(settings.BASE_DIR),
                env=sandbox.root_tool_env({"PYTHONPATH": str(settings.BASE_DIR)}),
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=nicer_by(settings.RUN_NICENESS),  # noqa: PLW1509 - Popen has no niceness option; the hook only calls os.nice
            )
        self.children[child.pid] = child
        return child.pid

    # --- the process layer (a simulated fleet replaces these: ``bench.scale.fleet``) ------------
    def containers_ready(self) -> tuple[bool, str]:
        return containers_ready()

    def pull(self, job: TrainingJob, attempt: JobAttempt) -> tuple[engine.PullResult, str]:
        """Pull the attempt's image; the outcome and the reference by digest (Podman's progress
        lines are kept for the run's log)."""
        lines: list[str] = []
        self.pull_lines = {attempt.pk: lines}
        return pull_image(job, attempt, progress=lambda line: lines.append(line.strip()[:300]) if line.strip() else None)

    def sweep_strays(self, live: set[str]) -> None:
        sweep_strays(live)

    def alive(self, pid: int) -> bool:
        """Whether a run's supervisor still runs."""
        return is_runner(pid)

    def signal(self, part: AttemptNode, sig: int) -> bool:
        """Signal every process of a run; False if it has not recorded its processes yet (with a
        port: as the port sends it)."""
        if self.port is not None:
            return self.port.signal(part, sig)
        return signal_run(part, sig)

    def reap(self) -> None:
        for pid, child in list(self.children.items()):
            if child.poll() is not None:
                del self.children[pid]


def nicer_by(increment: int) -> Callable[[], object] | None:
    """A ``preexec_fn`` that makes the runner (and so its run: niceness is inherited) ``increment``
    nicer than the agent; None for 0. A run cannot undo it: its container has no CAP_SYS_NICE."""
    if increment <= 0:
        return None
    return lambda: os.nice(increment)
