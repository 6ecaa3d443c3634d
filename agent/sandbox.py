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
* a network of its own with only the loopback interface (``--network=none``) for single-node
  jobs; multi-node jobs keep the node's network, which their rendezvous needs.

The job's environment reaches only the container (``--env-file``, read by Podman, never set in
the environment of a tool run as root). The runner puts the container in the run's cgroup
(``--cgroup-parent``) where its CPU, memory and PID limits are enforced.
"""
from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

# The NVIDIA driver's device nodes every CUDA process opens besides its own GPUs.
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
# Where a run finds its directories inside the container.
WORK_DIR = "/job/work"
OUTPUT_DIR = "/job/output"
FENCE_DIR = "/job/fence"  # the job's fence, read-only (agent.workdirs.write_fence)
CKPTLIB_ROOT = "/opt/ckptlib"  # holds the ckptlib package; its vendor directory is CHECKPOINT_VENDOR
VENDOR_DIR = f"{CKPTLIB_ROOT}/ckptlib/vendor"
HOME_DIR = "/tmp"
# The only environment a tool run as root gets: never the job's (GCONV_PATH, GLIBC_TUNABLES,
# LD_PRELOAD … would act on a root process).
ROOT_TOOL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


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


def container_argv(command: str, *, policy: Mapping, env_file: str, cgroup_parent: str | None, pidfile: str) -> list[str]:
    """The ``podman run`` argv that runs ``command`` (with ``bash -c``) in the container
    ``policy`` describes (see ``agent.launch.container_policy``): ``podman``, ``image``,
    ``name``, ``user``, ``mounts`` ([host, inside, "ro"|"rw"]), ``devices``, ``network``
    ("loopback" | "host"), ``workdir``, ``pids_limit``, ``labels``."""
    uid = int(policy["user"])
    argv = [
        policy["podman"], "run",
        "--name", policy["name"],
        "--pull", "never",  # the agent pulled it; the run uses exactly that digest
        "--init",
        "--user", f"{uid}:{uid}",
        "--cap-drop", "all",
        "--security-opt", "no-new-privileges",
        "--pids-limit", str(int(policy.get("pids_limit") or 4096)),
        "--env-file", env_file,
        "--env", f"HOME={HOME_DIR}",
        "--workdir", policy.get("workdir") or WORK_DIR,
        "--tmpfs", "/tmp:rw,nosuid,nodev,mode=1777",
        "--shm-size", str(policy.get("shm_size") or "1g"),
        "--pidfile", pidfile,
        "--log-driver", "none",
        "--stop-signal", "TERM",
        "--network", "host" if policy.get("network") == "host" else "none",
    ]
    if policy.get("network") == "host":
        argv += ["--hostname", str(policy.get("hostname") or "job")]
    if cgroup_parent:
        argv += ["--cgroup-parent", cgroup_parent]
    for key, value in sorted((policy.get("labels") or {}).items()):
        argv += ["--label", f"{key}={value}"]
    for host, inside, mode in policy.get("mounts", ()):
        options = "ro" if mode == "ro" else "rw"
        argv += ["--mount", f"type=bind,source={host},target={inside},{options}"]
    for host, inside in policy.get("devices", ()):
        argv += ["--device", f"{host}:{inside}" if inside else host]
    # stderr joins stdout inside the container, so their order is the order they were written.
    argv += [policy["image"], "bash", "-c", "exec 2>&1\n" + command]
    return argv


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
