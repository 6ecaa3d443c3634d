"""Rootless Podman for the runs a cluster's scheduler starts as an unprivileged account: a Slurm
site with ``DisableRootJobs=YES`` and ``ConstrainDevices=yes`` (docs/slurm-site.md), where a
rootful container cannot start inside the job's cgroup and one started outside it escapes Slurm.

Standard library only: the runner (``agent.runner``) and the cluster's Epilog import it.

* **Storage on the node**, never shared: ``<storage>/<uid>/<node>/`` holds the account's images
  (``rootless_storage_path``: a rootless user's ``graphroot`` is ignored, and its default, the
  home directory, is NFS on a site) and Podman's configuration; its run state is on the node's
  memory (``/dev/shm/satrain-<uid>-<node>``), the account's ``XDG_RUNTIME_DIR`` (a batch job has no
  login session). Two nodes on one host (the tests' cluster) keep theirs apart by node name.
* **The image is pulled on the node** by digest, with the credentials the console wrote into the
  rank's run directory (``runfiles.PULL_AUTH_FILE``, the account's alone).
* **The container** nests in the step's cgroup, so Slurm's device, memory and CPU limits hold in
  it; ``--userns=keep-id`` makes the run's user the account's own uid (the work directories are
  the account's), every capability dropped as on the agents' nodes.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from agent.allocation import SLURM_JOB_LABEL
from agent.sandbox import ROOT_TOOL_PATH

RUNTIME_BASE = Path("/dev/shm")


def node_dir(storage: str, uid: int, node: str) -> Path:
    return Path(storage) / str(uid) / (node or "node")


def runtime_dir(uid: int, node: str) -> Path:
    return RUNTIME_BASE / f"satrain-{uid}-{node or 'node'}"


def engine_env(storage: str, node: str, *, uid: int | None = None, home: str = "", create: bool = True) -> dict[str, str]:
    """Podman's whole environment for ``uid``'s rootless containers on ``node``; its directories
    and configuration files made where missing (as ``uid``: call it as that account; ``create``
    False: only named)."""
    uid = os.geteuid() if uid is None else uid
    base = node_dir(storage, uid, node)
    runtime = runtime_dir(uid, node)
    env = {
        "PATH": ROOT_TOOL_PATH,
        "LANG": "C.UTF-8",
        "HOME": home or pwd.getpwuid(uid).pw_dir,
        "XDG_RUNTIME_DIR": str(runtime),
        "XDG_CONFIG_HOME": str(base / "config"),
        "TMPDIR": str(base / "tmp"),
        "CONTAINERS_STORAGE_CONF": str(base / "storage.conf"),
        "CONTAINERS_CONF": str(base / "containers.conf"),
    }
    if not create:
        return env
    for directory in (base, base / "config", base / "tmp", runtime):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    storage_conf = base / "storage.conf"
    storage_text = f'[storage]\ndriver = "overlay"\nrunroot = "{runtime}/storage"\ngraphroot = "{base}/storage"\nrootless_storage_path = "{base}/storage"\n'
    containers_conf = base / "containers.conf"
    # No systemd session in a batch job: cgroupfs (runc nests the container below the step's
    # cgroup, which Slurm hands to the job's user), events to a file, runc as on the agents.
    containers_text = (
        '[engine]\ncgroup_manager = "cgroupfs"\nevents_logger = "file"\n'
        f'events_logfile_path = "{base}/events.log"\nruntime = "runc"\n[containers]\nlog_driver = "k8s-file"\n'
    )
    for path, text in ((storage_conf, storage_text), (containers_conf, containers_text)):
        if not path.exists() or path.read_text() != text:
            scratch = path.with_suffix(f".{os.getpid()}.tmp")
            scratch.write_text(text)
            os.replace(scratch, path)
    return env


def pull(podman: str, image: str, *, env: Mapping[str, str], auth_file: Path | None, tls_verify: bool, timeout: float = 900.0) -> tuple[bool, str]:
    """Pull ``image`` (by digest) into the node's storage unless it is there; (ok, what to say:
    how long the pull took, the registry's last words on failure, or nothing where it was there)."""
    started = time.monotonic()
    present = subprocess.run([podman, "image", "exists", image], check=False, env=dict(env), capture_output=True, timeout=60)
    if present.returncode == 0:
        return True, ""
    argv = [podman, "pull", "--quiet"]
    if auth_file is not None and auth_file.exists():
        argv += ["--authfile", str(auth_file)]
    if not tls_verify:
        argv.append("--tls-verify=false")
    try:
        done = subprocess.run([*argv, image], check=False, env=dict(env), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"the pull took longer than {timeout:.0f} s"
    if done.returncode == 0:
        return True, f"image pulled in {time.monotonic() - started:.1f} s"
    lines = [line.strip().removeprefix("Error: ") for line in done.stderr.splitlines() if line.strip()]
    return False, (lines[-1] if lines else f"podman pull exited {done.returncode}")[:300]


def remove_slurm_containers(podman: str, job_id: str, *, node: str, uid: int, storage: str) -> None:
    """Every container of the Slurm job ``job_id`` on ``node`` removed, as its account ``uid``
    (the Epilog, run as root). A container whose monitor Slurm killed leaves Podman's record of
    it "running": every later call of the account then fails until ``podman system migrate``."""
    try:
        account = pwd.getpwuid(uid)
    except KeyError:
        return
    env = engine_env(storage, node, uid=uid, home=account.pw_dir, create=False)
    if not Path(env["CONTAINERS_STORAGE_CONF"]).exists():
        return  # the account never ran a container on this node

    def podman_run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [podman, *args], check=False, env=env, capture_output=True, text=True, timeout=60, user=uid, group=account.pw_gid, extra_groups=[], cwd="/"
        )

    if podman_run("ps", "-q").returncode != 0:
        podman_run("system", "migrate")
    listed = podman_run("ps", "-aq", "--filter", f"label={SLURM_JOB_LABEL}={job_id}")
    names = listed.stdout.split() if listed.returncode == 0 else []
    if names:
        podman_run("rm", "--force", "--time", "0", *names)


def reap_job_cgroups(node: str, uid: str, job_id: str, *, base: Path = Path("/sys/fs/cgroup")) -> int:
    """Slurm's cgroups of ``job_id`` on ``node`` emptied and removed (the Epilog, as root): on
    cgroup v1 ``proctrack/cgroup`` signals only a step's own processes, so a container nested
    below a step outlives ``scancel`` or a time limit. Frozen, every process below killed, thawed,
    the directories removed depth-first. Returns how many processes were killed."""
    found = [path for prefix in (f"slurm_{node}", "slurm") for path in base.glob(f"*/{prefix}/uid_{uid}/job_{job_id}") if path.is_dir()]
    freezers = [path for path in found if path.parts[-4] == "freezer"]
    for path in freezers:
        _write(path / "freezer.state", "FROZEN")
    killed = 0
    for path in found:
        for procs in path.rglob("cgroup.procs"):
            try:
                pids = [int(p) for p in procs.read_text().split()]
            except (OSError, ValueError):
                continue
            for pid in pids:
                try:
                    os.kill(pid, 9)
                    killed += 1
                except ProcessLookupError:
                    pass
    for path in freezers:
        _write(path / "freezer.state", "THAWED")
    deadline = time.monotonic() + 5
    for path in found:
        for directory in [*sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True), path]:
            while True:
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
    return killed


def _write(path: Path, text: str) -> None:
    with contextlib.suppress(OSError):
        path.write_text(text)
