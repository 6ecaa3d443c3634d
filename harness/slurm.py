"""A real Slurm cluster for the tests: ``slurm_cluster``, one ``LocalSlurmCluster`` per test
session (munged, slurmctld, three slurmd on this host, fake GPUs), configured as a GPU site runs
Slurm (cgroups with ``ConstrainDevices=yes``, ``DisableRootJobs=YES``: jobs run as the service
account, their containers rootless); ``slurm_accounting_cluster``, one that keeps accounts, per
module; and ``slurm``, the console on a cluster (``BACKEND=slurm``).
Needs root and Debian's ``slurm-wlm`` and ``munge``; CI installs them and sets
``REQUIRE_SLURM=1``, so there a missing piece fails instead of skipping."""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from jobs.backends.slurm.client import SlurmError
from jobs.backends.slurm.cluster import LocalSlurmCluster, missing_tools


def slurm_missing(*, accounting: bool = False) -> str:
    missing = missing_tools(accounting=accounting, site=True)
    if missing:
        packages = "slurm-wlm munge uidmap slirp4netns" + (" slurmdbd mariadb-server" if accounting else "")
        return f"Slurm is not installed ({', '.join(missing)} missing: apt-get install {packages})"
    if os.geteuid() != 0:
        return "a local Slurm cluster needs root (mknod, slurmd)"
    return ""


def running_cluster(tmp_path_factory: pytest.TempPathFactory, name: str, *, accounting: bool = False) -> Iterator[LocalSlurmCluster]:
    """A started cluster, stopped after its scope; skipped (failed with ``REQUIRE_SLURM=1``) where
    this machine cannot run one."""
    reason = slurm_missing(accounting=accounting)
    if reason:
        if os.environ.get("REQUIRE_SLURM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    cluster = LocalSlurmCluster(site_dir(name), accounting=accounting, site=True)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


def site_dir(name: str) -> Path:
    """A directory outside pytest's own (``/tmp/satrain-<name>-…``, 0711): the cluster's service
    account must reach what is in it, and every pytest that starts (CI runs lanes side by side)
    makes ``/tmp/pytest-of-<user>`` 0700 again."""
    directory = Path(tempfile.mkdtemp(prefix=f"satrain-{name}-"))
    directory.chmod(0o711)
    return directory


def work_root(cluster: LocalSlurmCluster) -> Path:
    """A fresh ``JOB_WORK_ROOT`` for one console on ``cluster``, beside the cluster's files."""
    parent = cluster.root / "work"
    parent.mkdir(mode=0o711, exist_ok=True)
    directory = Path(tempfile.mkdtemp(dir=parent))
    directory.chmod(0o711)
    return directory


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurmCluster]:
    yield from running_cluster(tmp_path_factory, "slurm-cluster")


@pytest.fixture(scope="module")
def slurm_accounting_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurmCluster]:
    """A second cluster that keeps accounts (MariaDB and slurmdbd, limits enforced), for the
    tests marked ``slurm_accounting`` of one module: the session's cluster stays as simple as
    most clusters start."""
    yield from running_cluster(tmp_path_factory, "slurm-accounting", accounting=True)


@pytest.fixture
def slurm(request: pytest.FixtureRequest, settings) -> Iterator[LocalSlurmCluster]:
    """The console on the cluster: ``BACKEND=slurm``; every node returned to service after the
    test. A test marked ``slurm_accounting`` gets the cluster that keeps accounts."""
    accounting = request.node.get_closest_marker("slurm_accounting") is not None
    cluster: LocalSlurmCluster = request.getfixturevalue("slurm_accounting_cluster" if accounting else "slurm_cluster")
    # A run's GPUs are the cluster's GRES devices (character devices the job's cgroup allows or
    # denies), not stand-in files; its directories are where the service account reaches them.
    use_cluster(settings, cluster)
    settings.SLURM_SPOT_PARTITION = "spot"
    settings.SLURM_POLL_INTERVAL = 0.3
    yield cluster
    reset(cluster)


def node_storage() -> Path:
    """The test clusters' ``SLURM_NODE_STORAGE``: one per checkout, shared by every cluster its
    lanes start (each node pulls the default image once a run, not once a cluster), outside the
    checkout (the service account must reach it; a checkout may sit in a 0700 home). Not the
    default ``/var/tmp/satrain``: each checkout builds its own default image, a new digest, and
    every node kept every one (3.2 GB a node; a machine's CI trials filled its disk)."""
    tag = hashlib.sha256(str(Path(__file__).resolve().parent.parent).encode()).hexdigest()[:12]
    directory = Path("/var/tmp") / f"satrain-tests-{tag}"
    with contextlib.suppress(FileExistsError):
        directory.mkdir()
        directory.chmod(0o1777)  # as /var/tmp: each account makes and keeps its own <uid>/ in it
    return directory


def site_env(cluster: LocalSlurmCluster) -> dict[str, str]:
    """A live console's environment on ``cluster``: its jobs' directories beside the cluster's."""
    return {
        "BACKEND": "slurm", "SLURM_CONF": str(cluster.conf), "SLURM_HEALTH_DIR": str(cluster.health_dir), "SLURM_USER": cluster.user,
        "JOB_WORK_ROOT": str(work_root(cluster)), "SIMULATED_DEVICE_DIR": str(cluster.device_dir),
        "SLURM_NODE_STORAGE": str(node_storage()),
    }  # fmt: skip


def use_cluster(settings, cluster: LocalSlurmCluster) -> None:
    """An in-process console's settings on ``cluster`` (``site_env``, paths as paths)."""
    for name, value in site_env(cluster).items():
        setattr(settings, name, Path(value) if name in ("JOB_WORK_ROOT", "SIMULATED_DEVICE_DIR") else value)


def account_dir(cluster: LocalSlurmCluster, directory: Path) -> Path:
    """``directory`` (made where missing) the cluster's service account's, and reachable by it:
    where a batch job submitted as that account writes its output."""
    directory.mkdir(parents=True, exist_ok=True)
    account = pwd.getpwnam(cluster.user)
    os.chown(directory, account.pw_uid, account.pw_gid)
    cluster.open_to(directory)
    return directory


def reset(cluster: LocalSlurmCluster) -> None:
    """Every job cancelled, every node returned to service, every kernel log quiet: the next
    test finds the cluster idle."""
    cluster.clear_health()
    cluster.drain_on_fault(False)
    client = cluster.client
    for job in client.jobs():
        if job.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED"):
            client.cancel(job.job_id)
    for node in client.nodes():
        if "DRAIN" in node.state or "DOWN" in node.state:
            # SlurmError: its slurmd registered meanwhile and Slurm returned it itself
            with contextlib.suppress(SlurmError):
                client.resume(node.name)
