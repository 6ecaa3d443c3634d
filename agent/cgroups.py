"""CPU and memory limits for a run: its own cgroup, where the node allows one.

Standard library only: the runner (``agent.runner``) imports it. Each run (the whole container,
Podman's monitor included) is put into a cgroup of its own, ``sac-run-<runner pid>``, made below the runner's own
cgroup (the agent's: a service manages only its own subtree) or below ``JOB_CGROUP_PARENT``:

* cgroup v2 where ``/sys/fs/cgroup`` is the unified hierarchy (or a hybrid one has the ``cpu``
  and ``memory`` controllers): ``cpu.max``, ``memory.max``, ``memory.swap.max`` 0,
  ``memory.oom.group`` (an out-of-memory kill ends the whole run); the parent must be able to hand
  both controllers to its children, which v2 allows only to a cgroup without processes of its
  own, so a service usually names a prepared parent in ``JOB_CGROUP_PARENT``;
* else cgroup v1, the ``cpu`` and ``memory`` hierarchies: ``cpu.cfs_quota_us`` over
  ``cpu.cfs_period_us``, ``memory.limit_in_bytes`` (and ``memory.memsw.limit_in_bytes``).

A run's cgroup also ends every process of the run (``kill_all``) and tells whether the kernel
killed one for exceeding the memory limit (``oom_kills``). Where neither is available (no
writable hierarchy, not root), the run goes on without limits and ``support()`` says why.
"""

from __future__ import annotations

import os
import re
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
RUN_PREFIX = "sac-run-"
RUN_NAME = re.compile(r"^sac-run-\d+$")
PERIOD_US = 100_000
CONTROLLERS = ("cpu", "memory")
OPTIONAL_CONTROLLERS = ("pids",)  # a PID limit where the node has the controller
# A run's CPU weight against its siblings, a quarter of the default (v2 cpu.weight 100, v1
# cpu.shares 1024): runs share the CPU among themselves as before, but a node agent beside them
# (on v1 its own processes sit next to the runs' cgroups) gets the CPU it needs to read, store
# and stream their lines however busy the runs keep it.
RUN_CPU_WEIGHT_V2 = 25
RUN_CPU_SHARES_V1 = 256


@dataclass
class Hierarchy:
    """Where runs' cgroups go: ``mode`` "v1" or "v2" and, per controller, the parent directory
    (v2: one directory serves both)."""

    mode: str
    parents: dict[str, Path] = field(default_factory=dict)
    make_parents: bool = False  # the parents may be missing in some controllers (``same_path``)

    def directories(self, name: str) -> list[Path]:
        return sorted({parent / name for parent in self.parents.values()})


def _mountinfo() -> list[tuple[str, str, str, set[str]]]:
    """(root in the hierarchy, mount point, fs type, options) of every cgroup mount."""
    mounts = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append((fields[3], fields[4], tail[0], set(tail[2].split(",")) | set(fields[5].split(","))))
    return mounts


def _own_cgroups() -> dict[str, str]:
    """This process's cgroup path per v1 controller, and "" → its v2 path."""
    own: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return own
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            own[controller] = parts[2]
    return own


def _below(mount_root: str, mount_point: str, path: str) -> Path | None:
    """The directory of cgroup ``path`` under a mount of the hierarchy's ``mount_root``."""
    if not (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        return None
    rest = path[len(mount_root.rstrip("/")) :].lstrip("/")
    return Path(mount_point) / rest if rest else Path(mount_point)


def hierarchy(parent: str = "", *, same_path: bool = False) -> tuple[Hierarchy | None, str]:
    """Where this node puts runs' cgroups (below ``parent`` if given, else below this process's
    own cgroup), or None and why not. ``same_path``: on cgroup v1, one path in every controller
    (below this process's memory cgroup), as Podman's ``--cgroup-parent`` names one path for all."""
    mounts = _mountinfo()
    own = _own_cgroups()
    make_parents = False
    if same_path and not parent and not any(m[2] == "cgroup2" for m in mounts if Path(m[1]) == CGROUP_ROOT):
        parent, make_parents = own.get("memory", "/"), True
    v2 = [m for m in mounts if m[2] == "cgroup2"]
    for root, point, _, _ in v2:
        controllers = _read(Path(point) / "cgroup.controllers").split()
        if Path(point) == CGROUP_ROOT or {"cpu", "memory"} <= set(controllers):
            base = _below(root, point, parent or own.get("", "/"))
            if base is None:
                return None, f"this process's cgroup {own.get('')} is outside the mounted v2 hierarchy"
            return Hierarchy("v2", {c: base for c in CONTROLLERS + OPTIONAL_CONTROLLERS}), ""
    parents: dict[str, Path] = {}
    for controller in CONTROLLERS:
        mount = next((m for m in mounts if m[2] == "cgroup" and controller in m[3]), None)
        if mount is None:
            return None, f"no cgroup v1 '{controller}' hierarchy is mounted and no cgroup v2 one has it"
        base = _below(mount[0], mount[1], parent or own.get(controller, "/"))
        if base is None:
            return None, f"this process's '{controller}' cgroup is outside the mounted hierarchy"
        parents[controller] = base
    for controller in OPTIONAL_CONTROLLERS:
        mount = next((m for m in mounts if m[2] == "cgroup" and controller in m[3]), None)
        base = _below(mount[0], mount[1], parent or own.get(controller, "/")) if mount else None
        if base is not None:
            parents[controller] = base
    return Hierarchy("v1", parents, make_parents), ""


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as fh:
        fh.write(value)


def _try_write(path: Path, value: str) -> bool:
    try:
        _write(path, value)
        return True
    except OSError:
        return False


def _enable_v2_controllers(parent: Path) -> None:
    """A v2 parent hands ``cpu`` and ``memory`` to its children (done once; refused by the kernel
    while the parent itself holds processes, unless it is the root)."""
    enabled = set(_read(parent / "cgroup.subtree_control").split())
    available = set(_read(parent / "cgroup.controllers").split())
    missing = [c for c in CONTROLLERS + OPTIONAL_CONTROLLERS if c not in enabled and (c in CONTROLLERS or c in available)]
    if missing:
        _write(parent / "cgroup.subtree_control", " ".join(f"+{c}" for c in missing))


def create(h: Hierarchy, name: str, *, cpus: float | None, memory_mb: int | None, pids: int | None = None) -> list[Path]:
    """Make the cgroup ``name`` with the limits (None: unlimited); returns its directories.
    Raises OSError where the node does not allow it."""
    directories = h.directories(name)
    if h.mode == "v2":
        parent = h.parents["cpu"]
        parent.mkdir(parents=True, exist_ok=True)
        _enable_v2_controllers(parent)
    for directory in directories:
        if directory.exists():  # a run that died without cleaning up, under a reused pid
            remove(directories)
        directory.mkdir(parents=h.make_parents)
    try:
        if h.mode == "v2":
            directory = directories[0]
            quota = "max" if cpus is None else str(max(1000, round(cpus * PERIOD_US)))
            _write(directory / "cpu.max", f"{quota} {PERIOD_US}")
            _try_write(directory / "cpu.weight", str(RUN_CPU_WEIGHT_V2))
            _write(directory / "memory.max", "max" if memory_mb is None else str(memory_mb * 2**20))
            if memory_mb is not None:
                _try_write(directory / "memory.swap.max", "0")
            _try_write(directory / "memory.oom.group", "1")
            if pids:
                _try_write(directory / "pids.max", str(pids))
        else:
            cpu_dir, memory_dir = h.parents["cpu"] / name, h.parents["memory"] / name
            _write(cpu_dir / "cpu.cfs_period_us", str(PERIOD_US))
            _write(cpu_dir / "cpu.cfs_quota_us", "-1" if cpus is None else str(max(1000, round(cpus * PERIOD_US))))
            _try_write(cpu_dir / "cpu.shares", str(RUN_CPU_SHARES_V1))
            if memory_mb is not None:
                _write(memory_dir / "memory.limit_in_bytes", str(memory_mb * 2**20))
                _try_write(memory_dir / "memory.memsw.limit_in_bytes", str(memory_mb * 2**20))
            if pids and "pids" in h.parents:
                _write(h.parents["pids"] / name / "pids.max", str(pids))
    except OSError:
        remove(directories)
        raise
    return directories


def join_self(directories: list[str]) -> None:
    """Move the calling process into the run's cgroup (the runner calls it in the child, before
    ``exec``, so the whole sandbox starts inside)."""
    for directory in directories:
        fd = os.open(os.path.join(directory, "cgroup.procs"), os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def tree(directory: Path) -> list[Path]:
    """``directory`` and every cgroup below it (the container Podman makes inside a run's),
    deepest first. Walked without following links (a cgroup filesystem has none)."""
    found: list[Path] = []
    try:
        children = [Path(e.path) for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)]
    except OSError:
        children = []
    for child in children:
        found += tree(child)
    return [*found, Path(directory)]


def pids(directories: list[Path]) -> set[int]:
    """Every process in the run's cgroups, those below them included."""
    found: set[int] = set()
    for directory in directories:
        for each in tree(Path(directory)):
            found.update(int(p) for p in _read(each / "cgroup.procs").split() if p.isdigit())
    return found


def relative(directory: Path) -> str | None:
    """The cgroup path of ``directory`` as the kernel names it (what Podman's
    ``--cgroup-parent`` takes), or None if it is not under a cgroup mount."""
    for root, point, _, _ in sorted(_mountinfo(), key=lambda m: -len(m[1])):
        if directory == Path(point) or Path(point) in directory.parents:
            rest = str(directory)[len(point.rstrip("/")) :]
            return (root.rstrip("/") + rest) or "/"
    return None


def pids_at_limit(directories: list[Path]) -> int | None:
    """The run's PID limit where a cgroup of it is at that limit now (a fork loop), else None."""
    for directory in directories:
        for each in tree(Path(directory)):
            limit, current = _read(each / "pids.max").strip(), _read(each / "pids.current").strip()
            if limit.isdigit() and current.isdigit() and int(current) >= int(limit):
                return int(limit)
    return None


def kill_all(directories: list[Path]) -> int:
    """SIGKILL every process in the run's cgroup (forks racing with us included); returns how
    many were signalled."""
    killed = 0
    for directory in directories:
        if _try_write(Path(directory) / "cgroup.kill", "1"):
            return len(pids(directories))
    for _ in range(50):
        remaining = pids(directories)
        if not remaining:
            break
        for pid in remaining:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    return killed


def remove(directories: list[Path], *, timeout: float = 2.0) -> bool:
    """Kill what is left in the cgroup and remove it; False if it could not be removed in time."""
    deadline = time.monotonic() + timeout
    left = [each for d in directories if Path(d).exists() for each in tree(Path(d))]
    while left:
        if pids(left):
            kill_all(left)
        for directory in list(left):
            try:
                directory.rmdir()
                left.remove(directory)
            except FileNotFoundError:
                left.remove(directory)
            except OSError:
                pass
        if left:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
    return True


def oom_kills(directories: list[Path]) -> int:
    """How many processes of the run the kernel killed for exceeding its memory limit."""
    for directory in directories:
        for name in ("memory.events", "memory.oom_control"):
            match = re.search(r"^oom_kill (\d+)$", _read(Path(directory) / name), re.M)
            if match:
                return int(match[1])
    return 0


def is_run_cgroup(path: str) -> bool:
    """A path the agent may act on: a run's cgroup under the node's cgroup mount."""
    candidate = Path(path)
    return candidate.is_absolute() and CGROUP_ROOT in candidate.parents and ".." not in candidate.parts and bool(RUN_NAME.match(candidate.name))


def support(parent: str = "") -> tuple[bool, str]:
    """Whether runs on this node get enforced CPU and memory limits, and how (or why not): a
    trial cgroup with both limits is made and removed."""
    h, why = hierarchy(parent)
    if h is None:
        return False, why
    name = f"sac-probe-{os.getpid()}"  # not a run's name: no sweep takes it for a dead run's
    try:
        directories = create(h, name, cpus=1.0, memory_mb=64)
    except OSError as exc:
        where = ", ".join(str(p) for p in sorted(set(h.parents.values())))
        hint = "; v2 hands cpu and memory only to a cgroup without processes: set JOB_CGROUP_PARENT" if h.mode == "v2" else ""
        return False, f"cannot create a cgroup {h.mode} under {where}: {exc.strerror or exc}{hint}"
    remove(directories)
    return True, f"cgroup {h.mode}"


def sweep(h: Hierarchy, alive) -> int:
    """Remove the cgroups of runs whose runner is gone (``alive(pid)`` says): a runner killed
    outright leaves its cgroup behind. Returns how many were removed."""
    removed = 0
    for parent in set(h.parents.values()):
        try:
            names = [p.name for p in parent.iterdir() if RUN_NAME.match(p.name)]
        except OSError:
            continue
        for name in names:
            if not alive(int(name[len(RUN_PREFIX) :])) and remove([parent / name], timeout=0.5):
                removed += 1
    return removed


def memory_limit_reached(directories: list[Path]) -> bool:
    """Whether the run's memory reached its limit (cgroup v1: a refused charge, or a peak usage
    at the limit). With the container's own cgroup gone once it exited, this is the sign on v1
    that the SIGKILL which ended a run was the kernel's out-of-memory kill."""
    for directory in directories:
        for prefix in ("memory", "memory.memsw"):
            failures = _read(Path(directory) / f"{prefix}.failcnt").strip()
            peak = _read(Path(directory) / f"{prefix}.max_usage_in_bytes").strip()
            limit = _read(Path(directory) / f"{prefix}.limit_in_bytes").strip()
            if failures.isdigit() and int(failures) > 0:
                return True
            if peak.isdigit() and limit.isdigit() and int(limit) < 2**62 and int(peak) >= int(limit) * 0.98:
                return True
    return False


def remove_everywhere(path: str) -> None:
    """Remove the (empty) cgroup ``path`` from every mounted hierarchy: Podman makes a run's
    parent cgroup in each v1 controller it uses, not only in those the runner limits."""
    if not path or not RUN_NAME.match(Path(path).name) or ".." in Path(path).parts:
        return
    for root, point, _, _ in _mountinfo():
        directory = _below(root, point, path)
        if directory is not None and directory != Path(point):
            remove([directory], timeout=0.5)
