"""The container every run is started in: an OCI container run by Podman (``runc``), no
hand-rolled namespaces and nothing of the host's root filesystem.

Standard library only: the runner (``agent.runner``) imports it. What a run sees (an
allow-list; nothing else of the host is there to hide):

* the image's root filesystem (pulled from a registry by the node agent, run by digest);
* the mounts the agent lists in the policy: the run's work directory (``/job/work``), its output
  directory (``/job/output``, or its path in a writable project volume), the project's volumes
  (read-only unless an operator mapped them ``:rw``) and ckptlib's vendor directory read-only at a
  fixed path (``CHECKPOINT_VENDOR``);
* its own GPUs: on NVIDIA nodes the CDI devices of NVIDIA's container toolkit
  (``--device nvidia.com/gpu=<index>``), on simulated nodes the stand-in device nodes of its GPUs;
* every capability dropped, ``no-new-privileges``, Podman's default seccomp profile, a PID
  limit, the project's own unprivileged uid, an init (``catatonit``) as PID 1 that forwards signals
  and reaps, a private ``/tmp`` and ``/dev/shm``;
* a network of its own (``agent.networks``): a Podman bridge per attempt shared by its ranks on
  this host, reaching the outside world only with its project's ``outbound`` egress and never the
  node; a single-rank job without egress has loopback only (``--network=none``); the hosts'
  network only where an operator let a project's ranks on different hosts meet there;
* a seccomp profile that refuses new namespaces (user, mount, network …), ``mount``, ``setns`` and
  the kernel keyring, as Docker's default profile does for a container without CAP_SYS_ADMIN.

The job's environment reaches only the container (``--env-file``, read by Podman, never set in
the environment of a tool run as root); its secret variables never reach Podman's records: they
are a file on the node's ``/run`` (memory), mounted read-only and read by the command's shell, and
removed with the container when the run ends. The runner puts the container in the run's cgroup
(``--cgroup-parent``) where its CPU, memory and PID limits are enforced.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypedDict

# The NVIDIA driver's device nodes every CUDA process opens besides its own GPUs.
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# Where a run finds its directories inside the container.
WORK_DIR = "/job/work"
OUTPUT_DIR = "/job/output"
FENCE_DIR = "/job/fence"  # the job's fence, read-only (agent.workdirs.write_fence)
CKPTLIB_ROOT = "/opt/ckptlib"  # holds the ckptlib package; its vendor directory is CHECKPOINT_VENDOR
VENDOR_DIR = f"{CKPTLIB_ROOT}/ckptlib/vendor"
HOME_DIR = "/tmp"
SECRET_ENV_FILE = "/run/satrain/secret-env"  # the run's secret variables, read by its shell
# Where the node keeps what a run must not leave on disk (a tmpfs: gone at the latest on reboot).
NODE_RUN_DIR = Path("/run/satrain")
PODMAN_SECCOMP = Path("/usr/share/containers/seccomp.json")
# The only environment a tool run as root gets: never the job's (GCONV_PATH, GLIBC_TUNABLES,
# LD_PRELOAD … would act on a root process).
ROOT_TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class RunLimits(TypedDict):
    """The run's cgroup (``agent.cgroups``); None: unlimited, still a cgroup of its own."""

    cpus: float | None
    memory_mb: int | None
    pids: int | None
    cgroup_parent: str
    same_path: bool  # Podman's --cgroup-parent is one path for every v1 controller


class JobNetworkPolicy(TypedDict):
    """The attempt's own network: its name, this rank, its egress and the node's address pool."""

    name: str
    rank: int
    egress: str  # "none" | "outbound"
    pool: str
    deny: list[str]


class RootlessPolicy(TypedDict):
    """A run a scheduler starts as an unprivileged account (``agent.rootless``)."""

    storage: str  # the node-local directory of the account's images
    tls_verify: bool  # False: the platform's plain-HTTP local registry
    ranks: int  # the attempt's ranks: several meet on the hosts' network


class ContainerPolicy(TypedDict, total=False):
    """The run's container (``agent.sandbox.container_argv``)."""

    podman: str | None
    engine_env: dict[str, str]
    image: str  # by digest
    name: str
    user: int
    mounts: list[list[str]]  # [host, inside, "ro" | "rw"]
    devices: list[tuple[str, str]]
    workdir: str
    pids_limit: int
    network: str  # "loopback" | "job" | "host"
    job_network: JobNetworkPolicy  # where network is "job" (agent.networks.join)
    hostname: str
    labels: dict[str, int | str]
    shm_size: str
    rootless: RootlessPolicy  # started by an unprivileged account (a Slurm site): rootless Podman


def podman_path() -> str | None:
    return shutil.which("podman", path=ROOT_TOOL_PATH)


def root_tool_env(engine_env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment of ``podman`` (and any other tool the platform runs as root)."""
    return {"PATH": ROOT_TOOL_PATH, "LANG": "C.UTF-8", "HOME": "/root", **dict(engine_env or {})}


def gpu_devices(gpu_indices: Iterable[int], *, device_dir: str | None) -> list[tuple[str, str]]:
    """The devices a run on ``gpu_indices`` gets: ``device_dir`` holds a simulated node's
    stand-in device nodes (mounted at the same names under ``/dev``); None means a real NVIDIA
    node, whose GPUs are CDI devices (``nvidia.com/gpu=<index>``, the spec NVIDIA's container
    toolkit generates; the toolkit's hooks add the control devices and the driver's libraries)."""
    indices = list(gpu_indices)
    if device_dir is None:
        if cdi_spec_present():
            return [(f"nvidia.com/gpu={i}", "") for i in indices]
        # No CDI spec (NVIDIA's toolkit not set up): the device nodes themselves, where they exist.
        device_dir = "/dev"
    base = Path(device_dir)
    names = [f"nvidia{i}" for i in indices] + list(NVIDIA_CONTROL_DEVICES)
    return [(str(base / name), f"/dev/{name}") for name in names if (base / name).exists()]


CDI_DIRS = ("/etc/cdi", "/var/run/cdi")


def cdi_spec_present(kind: str = "nvidia.com/gpu") -> bool:
    """Whether a CDI spec for ``kind`` is on this node (``nvidia-ctk cdi generate`` writes one)."""
    for directory in map(Path, CDI_DIRS):
        try:
            specs = [p for p in directory.iterdir() if p.suffix in (".yaml", ".yml", ".json")]
        except OSError:
            continue
        for spec in specs:
            try:
                if kind.split("/")[0] in spec.read_text(errors="replace")[:4096]:
                    return True
            except OSError:
                continue
    return False


def container_argv(
    command: str,
    *,
    policy: ContainerPolicy,
    env_file: str,
    cgroup_parent: str | None,
    pidfile: str,
    network: tuple[str, str] | None = None,
    secret_file: str | None = None,
    seccomp: str | None = None,
) -> list[str]:
    """The ``podman run`` argv that runs ``command`` (with ``bash -c``) in the container
    ``policy`` describes (see ``agent.launch.container_policy``): ``podman``, ``image``,
    ``name``, ``user``, ``mounts`` ([host, inside, "ro"|"rw"]), ``devices``, ``network``
    ("loopback" | "job" | "host"), ``workdir``, ``pids_limit``, ``labels``. ``network``: the
    job network's name and this rank's address there (``agent.networks.join``); ``secret_file``:
    the run's secret variables on the node (``write_secret_env``); ``seccomp``: the profile."""
    uid = int(policy["user"])
    rootless = policy.get("rootless")
    podman = policy["podman"]
    if podman is None:  # Popen would fail on the None anyway; say what is missing
        raise ValueError("the run's container policy names no Podman")
    argv = [
        podman,
        "run",
        "--name",
        policy["name"],
        "--pull",
        "never",  # the agent pulled it; the run uses exactly that digest
        "--init",
        "--user",
        f"{uid}:{uid}",
        "--cap-drop",
        "all",
        "--security-opt",
        "no-new-privileges",
        "--env-file",
        env_file,
        "--env",
        f"HOME={HOME_DIR}",
        "--workdir",
        policy.get("workdir") or WORK_DIR,
        "--tmpfs",
        "/tmp:rw,nosuid,nodev,mode=1777",
        "--shm-size",
        str(policy.get("shm_size") or "1g"),
        "--pidfile",
        pidfile,
        "--log-driver",
        "none",
        "--stop-signal",
        "TERM",
    ]
    if rootless:
        # The run's user is the account itself, whose directories it writes; the PID limit is
        # the scheduler's (rootless Podman on cgroup v1 cannot set one, and says so).
        argv += ["--userns", "keep-id"]
    else:
        argv += ["--pids-limit", str(int(policy.get("pids_limit") or 4096))]
    if seccomp:
        argv += ["--security-opt", f"seccomp={seccomp}"]
    mode = policy.get("network")
    if rootless and mode == "job":
        # Job bridges and egress rules need root: ranks on several nodes meet on the hosts'
        # network (as a site's Pyxis or Apptainer jobs do); one rank with egress goes out through
        # slirp4netns, never to the host's loopback.
        if int(rootless.get("ranks") or 1) > 1:
            mode = "host"
        elif "job_network" in policy and policy["job_network"]["egress"] == "outbound":
            mode = "slirp4netns"
        else:
            mode = "loopback"
    if mode == "slirp4netns":
        argv += ["--network", "slirp4netns:allow_host_loopback=false", "--hostname", str(policy.get("hostname") or "job")]
    elif mode == "job" and network is not None:
        argv += ["--network", network[0], "--ip", network[1], "--sysctl", "net.ipv6.conf.all.disable_ipv6=1"]
        argv += ["--hostname", str(policy.get("hostname") or "job")]
    elif mode == "host":
        argv += ["--network", "host", "--hostname", str(policy.get("hostname") or "job")]
    else:
        argv += ["--network", "none"]
    if cgroup_parent:
        argv += ["--cgroup-parent", cgroup_parent]
    for key, value in sorted((policy.get("labels") or {}).items()):
        argv += ["--label", f"{key}={value}"]
    for host, inside, mode in policy.get("mounts", ()):
        options = "ro" if mode == "ro" else "rw"
        argv += ["--mount", f"type=bind,source={host},target={inside},{options}"]
    if secret_file:
        argv += ["--mount", f"type=bind,source={secret_file},target={SECRET_ENV_FILE},ro"]
    for host, inside in policy.get("devices", ()):
        argv += ["--device", f"{host}:{inside}" if inside else host]
    # stderr joins stdout inside the container, so their order is the order they were written.
    prologue = "exec 2>&1\n"
    if secret_file:
        prologue += f"set -a; . {SECRET_ENV_FILE}; set +a\n"
    argv += [policy["image"], "bash", "-c", prologue + command]
    return argv


def remove_container(podman: str, name: str, env: Mapping[str, str], *, timeout: float = 120) -> bool:
    """Remove the container ``name`` (gone already: fine). A container whose monitor (conmon) was
    killed with its run (a SIGKILL to the run's cgroup) is refused once ("could not be stopped":
    Podman left it Stopping) and removed by the second try. Returns whether it is gone."""
    for _ in range(2):
        done = subprocess.run([podman, "rm", "--force", "--ignore", "--time", "0", name], check=False, env=dict(env), capture_output=True, timeout=timeout)
        if done.returncode == 0:
            return True
    return False


def write_secret_env(name: str, secrets: Mapping[str, str], uid: int, *, run_dir: Path = NODE_RUN_DIR) -> str:
    """The run's secret variables as a file the container's shell sources (``NAME='value'``, one a
    line), on the node's ``/run`` (memory; ``run_dir``: a rootless account's own), readable by the
    run's uid alone; its path."""
    run_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
    directory = run_dir / "secrets"
    directory.mkdir(mode=0o711, exist_ok=True)
    path = directory / f"{name}.env"
    text = "".join(f"{key}={shlex.quote(value)}\n" for key, value in secrets.items() if key.isidentifier() and key.isascii())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o400)
    try:
        os.write(fd, text.encode())
        if os.geteuid() == 0:
            os.fchown(fd, uid, uid)
    finally:
        os.close(fd)
    return str(path)


def remove_secret_env(name: str, *, run_dir: Path = NODE_RUN_DIR) -> None:
    (run_dir / "secrets" / f"{name}.env").unlink(missing_ok=True)


# Docker's default profile refuses these to a container without CAP_SYS_ADMIN; Podman's allows
# them (for rootless nesting): a job would get every capability in a user namespace of its own.
REFUSED_SYSCALLS = (
    "unshare",
    "setns",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "keyctl",
    "add_key",
    "request_key",
    "fsopen",
    "fsmount",
    "move_mount",
    "open_tree",
    "mount_setattr",
)
# clone(2) flags that make a namespace: refused, as Docker's profile refuses them (flags & mask == 0).
CLONE_NEW_MASK = 0x7E020000
EPERM, ENOSYS = 1, 38


def seccomp_profile(base: Path = PODMAN_SECCOMP, *, run_dir: Path = NODE_RUN_DIR) -> str:
    """Podman's default profile without new namespaces, mounts or keyrings, written once to the
    node's run directory (``run_dir``: a rootless account's own); its path. ``clone3`` answers ENOSYS, so the C library falls back to
    ``clone``, whose namespace flags are refused."""
    profile = json.loads(base.read_text())
    refused = {*REFUSED_SYSCALLS, "clone", "clone3"}
    syscalls = []
    for rule in profile.get("syscalls", []):
        if rule.get("action") == "SCMP_ACT_ALLOW":
            names = [n for n in rule.get("names", []) if n not in refused]
            if not names:
                continue
            rule = {**rule, "names": names}
        syscalls.append(rule)
    syscalls += [
        {"names": ["clone"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": CLONE_NEW_MASK, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": ENOSYS},
        {"names": sorted(REFUSED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": EPERM},
    ]
    text = json.dumps({**profile, "syscalls": syscalls}, sort_keys=True)
    run_dir.mkdir(mode=0o711, parents=True, exist_ok=True)
    path = run_dir / f"seccomp-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    if not path.exists():
        scratch = path.with_suffix(f".{os.getpid()}.tmp")
        scratch.write_text(text)
        os.replace(scratch, path)
    return str(path)


def env_file_text(env: Mapping[str, str]) -> tuple[str, list[str]]:
    """The job's environment as Podman's ``--env-file`` (one ``NAME=value`` a line), and the
    names left out because a line cannot hold them (a newline in the value)."""
    lines, skipped = [], []
    for name, value in env.items():
        if "\n" in value or "\r" in value or "\n" in name or "=" in name or not name:
            skipped.append(name)
            continue
        lines.append(f"{name}={value}")
    return "".join(line + "\n" for line in lines), skipped
