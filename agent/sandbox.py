"""The sandbox every run is started in: Debian's bubblewrap (``bwrap``), no hand-rolled namespaces.

Standard library only: the runner (``agent.runner``) imports it. What a run sees:

* the whole system read-only (so the image's environment and the system's tools work as before),
  with the console's own state hidden under empty ``tmpfs`` mounts: its ``var/`` (database, secret
  key), the job work root (every job's spec, records and output), and any other path the agent
  names in ``hidden``;
* writable: its own work and output directories, and the project volumes an operator mapped
  read-write (read-only ones are mounted read-only);
* a private ``/tmp`` (also its ``HOME``), a new PID namespace with its own ``/proc`` (no other
  process of the node is visible, ``/proc/<pid>/environ`` of the console included), a minimal
  ``/dev`` with only its own GPUs' device nodes (``/dev/nvidia<N>`` and the control devices);
* the node's network (multi-node jobs need it for rendezvous).

The sandbox dies with its runner (``--die-with-parent``): SIGKILL to the run's process group
ends every process of the run, whatever session it moved to. The runner's own records
(``pid.json``, ``output.jsonl``, ``exit.json``) live outside it, under the hidden work root.
"""
from __future__ import annotations

import functools
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path

# The NVIDIA driver's device nodes every CUDA process opens besides its own GPUs.
NVIDIA_CONTROL_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def availability() -> tuple[bool, str]:
    """Whether this machine can start a sandbox, and if not, why (cached per process)."""
    path = bwrap_path()
    if path is None:
        return False, "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    try:
        probe = subprocess.run(
            [path, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--die-with-parent", "true"],
            capture_output=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"bubblewrap could not start: {exc}"
    if probe.returncode != 0:
        why = probe.stderr.decode("utf-8", "replace").strip().splitlines()
        return False, f"bubblewrap cannot create namespaces here ({why[-1] if why else probe.returncode}); user namespaces may be off"
    return True, ""


def gpu_devices(gpu_indices: Iterable[int], *, device_dir: str = "/dev") -> list[tuple[str, str]]:
    """(host path, path in the sandbox) of the device nodes a run on ``gpu_indices`` may open;
    ``device_dir`` holds a simulated node's stand-ins, mounted at the same names under ``/dev``."""
    base = Path(device_dir)
    names = [f"nvidia{i}" for i in gpu_indices] + list(NVIDIA_CONTROL_DEVICES)
    return [(str(base / name), f"/dev/{name}") for name in names if (base / name).exists()]


def wrap(command: list[str], *, policy: Mapping, cwd: str) -> list[str]:
    """The argv that runs ``command`` in the sandbox ``policy`` describes (see ``agent.launch``):
    ``bwrap``, ``hidden``, ``writable``, ``readonly``, ``devices``, ``home``."""
    argv = [
        policy["bwrap"],
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--tmpfs", "/tmp",
        "--tmpfs", "/dev/shm",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
    ]
    # Read-only trees first (the image, the platform's code: they may lie under /tmp, which the
    # run gets empty), then the hidden state on top, then the run's own directories on top of that.
    for path in policy.get("readonly", ()):
        argv += ["--ro-bind-try", path, path]
    for path in policy.get("hidden", ()):
        if Path(path).is_dir():
            argv += ["--tmpfs", path]
    for path in policy.get("writable", ()):
        argv += ["--bind", path, path]
    for host, inside in policy.get("devices", ()):
        argv += ["--dev-bind", host, inside]
    home = policy.get("home") or "/tmp"
    argv += ["--setenv", "HOME", home, "--chdir", cwd, "--", *command]
    return argv
