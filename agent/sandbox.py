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
* a network of its own with only the loopback interface (``--unshare-net``; bwrap brings ``lo``
  up): nothing of the node or beyond is reachable, the console, its database and Redis on
  127.0.0.1 included, while the processes of one run still meet on localhost (torchrun's
  workers); multi-node jobs keep the node's network, which their rendezvous needs.

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
            [path, "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--unshare-pid", "--unshare-net", "--die-with-parent", "true"],
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


def wrap(command: list[str], *, policy: Mapping, cwd: str, run_dir: str | None = None) -> list[str]:
    """The argv that runs ``command`` in the sandbox ``policy`` describes (see ``agent.launch``):
    ``bwrap``, ``hidden``, ``writable``, ``readonly``, ``devices``, ``home``, ``network``
    ("loopback": a network namespace of its own; "host": the node's) and, where the agent is
    root, ``user`` (the project's unprivileged uid, named in an ``/etc/passwd`` written to
    ``run_dir``)."""
    argv = [
        policy["bwrap"],
        "--ro-bind", "/", "/",
        "--dev", "/dev",
        "--proc", "/proc",
        "--perms", "1777", "--tmpfs", "/tmp",
        "--perms", "1777", "--tmpfs", "/dev/shm",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",
    ]
    if policy.get("network", "loopback") != "host":
        argv.append("--unshare-net")
    user = policy.get("user")
    empty = ["/tmp", *policy.get("hidden", ())]
    if user:
        # A job user must reach what it may read, e.g. an interpreter under root's 0700 home: such
        # a closed directory becomes an empty one it may traverse, and only the trees it needs
        # are mounted back into it.
        for closed in closed_parents([*policy.get("readonly", ()), *policy.get("writable", ())], empty):
            argv += ["--perms", "0711", "--tmpfs", closed]
            empty.append(closed)
    # Read-only trees first (the image, the platform's code: they may lie under /tmp, which the
    # run gets empty), then the hidden state on top, then the run's own directories on top of that.
    for path in policy.get("readonly", ()):
        argv += parents_of(path, empty) + ["--ro-bind-try", path, path]
    for path in policy.get("hidden", ()):
        if Path(path).is_dir():
            argv += ["--tmpfs", path]
    for path in policy.get("writable", ()):
        argv += parents_of(path, empty) + ["--bind", path, path]
    for host, inside in policy.get("devices", ()):
        argv += ["--dev-bind", host, inside]
    if user and run_dir:
        passwd, group = identity_files(user, Path(run_dir))
        argv += ["--ro-bind", str(passwd), "/etc/passwd", "--ro-bind", str(group), "/etc/group"]
        command = [
            user["setpriv"], f"--reuid={user['uid']}", f"--regid={user['uid']}", "--clear-groups",
            "--inh-caps=-all", "--bounding-set=-all", "--", *command,
        ]
    home = policy.get("home") or "/tmp"
    argv += ["--setenv", "HOME", home, "--chdir", cwd, "--", *command]
    return argv


def closed_parents(paths: list[str], empty: list[str]) -> list[str]:
    """Directories above ``paths`` that other users cannot traverse (outside the emptied trees),
    outermost first."""
    found: set[str] = set()
    for path in paths:
        for parent in Path(path).parents:
            if parent == Path("/") or any(Path(base) == parent or Path(base) in parent.parents for base in empty):
                continue
            try:
                if not parent.stat().st_mode & 0o001:
                    found.add(str(parent))
            except OSError:
                continue
    return sorted(found, key=lambda p: (p.count("/"), p))


def parents_of(path: str, empty: list[str]) -> list[str]:
    """``--dir`` for every directory between an emptied tree (``/tmp``, a hidden one) and
    ``path``: bwrap would make them 0700, closed to an unprivileged job user."""
    args: list[str] = []
    target = Path(path)
    for base in map(Path, empty):
        if base in target.parents:
            for parent in reversed(target.parents):
                if base in parent.parents:
                    args += ["--perms", "0755", "--dir", str(parent)]
            break
    return args


def identity_files(user: Mapping, run_dir: Path) -> tuple[Path, Path]:
    """The node's /etc/passwd and /etc/group with the job's user added, for the sandbox."""
    name, uid = user["name"], int(user["uid"])
    passwd, group = run_dir / "passwd", run_dir / "group"
    try:
        system_users = Path("/etc/passwd").read_text()
        system_groups = Path("/etc/group").read_text()
    except OSError:
        system_users = "root:x:0:0:root:/root:/bin/sh\n"
        system_groups = "root:x:0:\n"
    passwd.write_text(system_users.rstrip("\n") + f"\n{name}:x:{uid}:{uid}:{name}:/tmp:/bin/sh\n")
    group.write_text(system_groups.rstrip("\n") + f"\n{name}:x:{uid}:\n")
    return passwd, group
