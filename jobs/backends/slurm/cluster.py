"""A Slurm cluster on one host, for tests and development: ``munged``, ``slurmctld`` and one
``slurmd -N node-x`` per node, every file under one directory, every port free at start.

Made from the configuration that ran on the CI kind of machine (Debian 12's ``slurm-wlm`` 22.05,
``munge``): fake GPUs are GRES backed by character devices (``mknod … c 195 N``: plain files are
refused), so a ``--gres=gpu:2`` job gets ``CUDA_VISIBLE_DEVICES=0,1``. Process tracking is
``proctrack/linuxproc`` with ``task/none``, the portable pair (``proctrack/cgroup`` needs the
host's cgroup layout). A requeued job would wait ``cred_expire`` + 1 s and the scheduler's
intervals: they are set short (``cred_expire=10``, ``sched_interval=2``, ``bf_interval=1``).
Needs root (``mknod``; slurmd runs jobs as their submitting user).

With ``site=True`` (the tests' cluster) it is configured as GPU sites run Slurm
(docs/slurm-site.md): ``proctrack/cgroup`` and ``task/cgroup`` with ``ConstrainDevices=yes`` (a job
opens only the GPUs Slurm gave it) and ``ConstrainRAMSpace=yes``, ``DisableRootJobs=YES`` (jobs run
as ``user``, a service account made here where missing), an Epilog as root that reaps what a job's
containers left in its cgroups (``agent.runner --slurm-epilog``). Each ``slurmd`` makes host-wide
cgroups named by node and job id: the cluster's job ids start at a random ``FirstJobId``, so two
test clusters on one host never share a job's cgroup. Its files are reachable by ``user``
(``open_to``): the munge socket's directory and every directory above the cluster's are
traversable (the key stays 0400 in a 0700 directory).

With ``accounting=True`` it also keeps accounts: a private MariaDB (its own data directory,
loopback port and password) and ``slurmdbd``, limits enforced
(``AccountingStorageEnforce=associations,limits,safe``, ``gres/gpu`` a TRES). Clients reach
slurmdbd through the cluster's own munged: ``AccountingStoragePass`` names its socket (without
it, ``sacctmgr`` authenticates through munge's default socket and slurmdbd refuses it).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from jobs.backends.slurm.client import SlurmClient, SlurmError

SPOT_PARTITION = "spot"
HEALTH_CHECK_INTERVAL_S = 3
SPOT_GRACE_S = 15  # a contained run's SIGTERM, its checkpoint and Podman's clean-up fit in it
# The Unix account a site's console submits every job as (docs/slurm-site.md).
SERVICE_ACCOUNT = "satrain-svc"
# Another user of the cluster, outside the console (the tests' "someone else's sbatch").
OTHER_USER = "satrain-other"
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "squeue", "sinfo", "scancel")
# Accounting's (Debian: ``apt-get install slurmdbd mariadb-server``).
ACCOUNTING = ("slurmdbd", "sacctmgr", "mariadbd", "mariadb-install-db", "mariadb")


# A site's (rootless containers for its service account: ``apt-get install uidmap slirp4netns``).
SITE = ("useradd", "newuidmap", "newgidmap", "slirp4netns")


def missing_tools(*, accounting: bool = False, site: bool = False) -> list[str]:
    """The Slurm and munge commands this machine lacks (Debian: ``apt-get install slurm-wlm munge``)."""
    wanted = DAEMONS + (ACCOUNTING if accounting else ()) + (SITE if site else ())
    return [tool for tool in wanted if shutil.which(tool, path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin") is None]


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class LocalSlurmCluster:
    """``start()`` brings the cluster up (nodes ``idle``), ``stop()`` ends every daemon it started.

    Args:
        root: Directory for its configuration, state, logs, fake devices and munge key.
        nodes: Node names (listed, never as a range: ``node-[a-c]`` is fatal to Slurm).
        gpus: Fake GPUs per node.
        cpus: CPUs each node declares.
        accounting: Keep accounts (MariaDB and slurmdbd), enforcing their limits.
        site: Configured as GPU sites run Slurm (cgroups, ``ConstrainDevices``, ``DisableRootJobs``).
        user: The Unix account jobs run as on a ``site`` cluster (made where missing).
    """

    def __init__(
        self,
        root: Path,
        *,
        nodes: Sequence[str] = ("node-a", "node-b", "node-c"),
        gpus: int = 4,
        cpus: int = 4,
        accounting: bool = False,
        site: bool = False,
        user: str = SERVICE_ACCOUNT,
    ) -> None:
        self.root = root
        self.accounting = accounting
        self.site = site
        self.user = user if site else "root"
        self.other_user = OTHER_USER if site else "root"
        self.nodes = list(nodes)
        self.gpus = gpus
        self.cpus = cpus
        self.processes: list[subprocess.Popen[bytes]] = []
        self.conf = root / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.client = SlurmClient(env={"SLURM_CONF": str(self.conf)})

    # --- set-up ----------------------------------------------------------------------------
    def write_config(self) -> None:
        root = self.root
        for sub in ("etc", "state", "run", "log", "munge", "munge-key", "spool", "jobs", "db"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        # The socket's directory is every job user's way to munged (sbatch and srun in a job); the
        # key is munged's alone.
        os.chmod(root / "munge", 0o755)
        os.chmod(root / "munge-key", 0o700)
        key = root / "munge-key" / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        ctld_port, dbd_port, self.db_port, *node_ports = _free_ports(3 + len(self.nodes))
        lines = [
            "ClusterName=console",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={ctld_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={root}/munge/munge.socket,cred_expire=10",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={root}/state",
            f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmctldPidFile={root}/run/slurmctld.pid",
            f"SlurmdPidFile={root}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={root}/log/slurmctld.log",
            f"SlurmdLogFile={root}/log/slurmd-%n.log",
            *(self._site_lines() if self.site else ["ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none"]),
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SlurmdParameters=config_overrides",
            "GresTypes=gpu",
            "SchedulerType=sched/backfill",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            "SchedulerParameters=nohold_on_prolog_fail,sched_interval=2,bf_interval=1",
            *(self._accounting_lines(dbd_port) if self.accounting else ["AccountingStorageType=accounting_storage/none"]),
            f"JobAcctGatherType=jobacct_gather/{'cgroup' if self.site else 'none'}",
            "ReturnToService=2",
            "SlurmdTimeout=10",
            "InactiveLimit=0",
            "KillWait=5",
            "MinJobAge=300",
            f"Epilog={root}/etc/epilog.sh",
            # Each node's own health check hands its kernel log's fault lines to the console.
            f"HealthCheckProgram={root}/etc/healthcheck.sh",
            f"HealthCheckInterval={HEALTH_CHECK_INTERVAL_S}",
        ]
        gres = ["AutoDetect=off"]
        for name, port in zip(self.nodes, node_ports, strict=True):
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs={self.cpus} RealMemory=2000 Gres=gpu:{self.gpus} State=UNKNOWN"
            )
            devices = self.device_dir / name
            devices.mkdir(parents=True, exist_ok=True)
            for index in range(self.gpus):
                device = devices / f"nvidia{index}"
                if not device.exists():
                    os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(195, index))
                device.chmod(0o666)  # as NVIDIA's: the devices cgroup, not the mode, decides
            gres.append(f"NodeName={name} Name=gpu File={devices}/nvidia[0-{self.gpus - 1}]")
        # Spot: a preemptible partition on the same nodes. On-Demand work (the higher tier)
        # requeues a Spot job it needs the GPUs of, SIGTERM first and GraceTime to save.
        nodes = ",".join(self.nodes)
        lines.append(f"PartitionName=gpu Nodes={nodes} Default=YES MaxTime=INFINITE State=UP PriorityTier=2")
        lines.append(f"PartitionName=spot Nodes={nodes} MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime={SPOT_GRACE_S}")
        self.conf.write_text("\n".join(lines) + "\n")
        # The console's runs' containers outlive a runner Slurm killed: the epilog removes them.
        epilog = root / "etc" / "epilog.sh"
        base = Path(__file__).resolve().parents[3]
        epilog.write_text(f"#!/bin/sh\nexport SLURM_CONF={self.conf} PYTHONPATH={base}\nexec {sys.executable} -m agent.runner --slurm-epilog\n")
        if self.site:
            (root / "etc" / "cgroup.conf").write_text("CgroupPlugin=autodetect\nConstrainCores=no\nConstrainRAMSpace=yes\nConstrainDevices=yes\n")
        epilog.chmod(0o755)
        # The nodes' kernel logs are as fake as their GPUs: one file per node (``kernel_log``).
        (root / "kmsg").mkdir(exist_ok=True)
        for name in self.nodes:
            self.kernel_log(name).touch()
        check = root / "etc" / "healthcheck.sh"
        # An operator's choice whether the check drains its own node on a fatal record, as sites'
        # NHC checks do (``drain_on_fault``): read at each check.
        check.write_text(
            f"#!/bin/sh\nexport SATRAIN_HEALTH_DIR={self.health_dir} SATRAIN_KERNEL_LOG={root}/kmsg/$SLURMD_NODENAME PYTHONPATH={base}\n"
            f"export SLURM_CONF={self.conf} SATRAIN_DRAIN_ON_FAULT=$(cat {self._drain_flag} 2>/dev/null)\n"
            f"exec {sys.executable} -m failover.nodecheck\n"
        )
        check.chmod(0o755)
        (root / "etc" / "gres.conf").write_text("\n".join(gres) + "\n")

    def _site_lines(self) -> list[str]:
        """What a GPU site's ``slurm.conf`` adds: cgroups (``cgroup.conf``: devices and memory
        constrained), no job as root, job ids of their own (cgroups are host-wide)."""
        return [
            "ProctrackType=proctrack/cgroup",
            "TaskPlugin=task/cgroup",
            "DisableRootJobs=YES",
            f"FirstJobId={1000 + secrets.randbelow(60_000) * 1000}",
        ]

    def open_to(self, path: Path) -> None:
        """Every directory above ``path`` (and ``path``) traversable by the job user (o+x), as a
        site's shared directories are: pytest's and ``mkdtemp``'s are 0700."""
        for directory in [path, *path.parents]:
            try:
                info = directory.stat()
            except FileNotFoundError:
                continue
            if info.st_uid == os.geteuid() and not info.st_mode & stat.S_IXOTH:
                directory.chmod(stat.S_IMODE(info.st_mode) | stat.S_IXOTH)

    def ensure_users(self) -> None:
        """The service account jobs run as (``useradd -m -U``: Debian gives it a subordinate id
        range, which its rootless containers map their users into) and another user of the
        cluster's."""
        for name in (self.user, self.other_user):
            try:
                pwd.getpwnam(name)
            except KeyError:
                # Another test cluster on this host may be making it at the same moment.
                made = subprocess.run(["useradd", "-m", "-U", "-s", "/bin/sh", name], check=False, capture_output=True, text=True, timeout=60)
                try:
                    pwd.getpwnam(name)
                except KeyError:
                    raise RuntimeError(f"could not make the Unix user {name}: {made.stderr.strip()}") from None

    def _accounting_lines(self, dbd_port: int) -> list[str]:
        root = self.root
        self.db_password = secrets.token_hex(16)
        dbd = root / "etc" / "slurmdbd.conf"
        dbd.write_text(
            "\n".join([
                "AuthType=auth/munge", f"AuthInfo=socket={root}/munge/munge.socket", "DbdHost=localhost", "DbdAddr=127.0.0.1",
                f"DbdPort={dbd_port}", "SlurmUser=root", f"PidFile={root}/run/slurmdbd.pid", f"LogFile={root}/log/slurmdbd.log",
                "StorageType=accounting_storage/mysql", "StorageHost=127.0.0.1", f"StoragePort={self.db_port}", "StorageUser=slurm",
                f"StoragePass={self.db_password}", "StorageLoc=slurm_acct_db",
            ]) + "\n"
        )  # fmt: skip
        dbd.chmod(0o600)
        return [
            "AccountingStorageType=accounting_storage/slurmdbd", "AccountingStorageHost=127.0.0.1", f"AccountingStoragePort={dbd_port}",
            f"AccountingStoragePass={root}/munge/munge.socket", "AccountingStorageEnforce=associations,limits,safe",
            # sacct keeps the job's --comment, which names the console's job and user.
            "AccountingStorageTRES=gres/gpu", "AccountingStoreFlags=job_comment",
        ]  # fmt: skip

    def _start_accounting(self, deadline: float) -> None:
        """MariaDB under ``db/`` on its own loopback port, then slurmdbd; returns once it answers."""
        db = self.root / "db"
        if not (db / "data" / "mysql").exists():
            subprocess.run(
                ["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={db}/data", "--auth-root-authentication-method=socket", "--skip-test-db"],
                check=True, capture_output=True, timeout=120,
            )  # fmt: skip
        self._spawn(
            ["mariadbd", "--no-defaults", "--user=root", f"--datadir={db}/data", f"--socket={db}/mysqld.sock", f"--port={self.db_port}",
             "--bind-address=127.0.0.1", f"--pid-file={db}/mysqld.pid", f"--log-error={self.root}/log/mariadb.log"],
            "mariadbd",
        )  # fmt: skip
        grant = (
            f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{self.db_password}';"
            f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{self.db_password}';"
            "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
        )
        self._until(deadline, "MariaDB", lambda: subprocess.run(
            ["mariadb", "--no-defaults", f"--socket={db}/mysqld.sock", "-u", "root", "-e", grant], check=False, capture_output=True, timeout=30
        ).returncode == 0)  # fmt: skip
        self._spawn(["slurmdbd", "-D"], "slurmdbd")

        def cluster_known() -> bool:
            subprocess.run(["sacctmgr", "--immediate", "add", "cluster", "console"], capture_output=True, env=self.env, timeout=30, check=False)
            return "console" in self.client.run("sacctmgr", "--noheader", "list", "cluster", "format=cluster").split()

        self._until(deadline, "slurmdbd", cluster_known)

    def _until(self, deadline: float, what: str, ready: Callable[[], object]) -> None:
        while time.monotonic() < deadline:
            try:
                if ready():
                    return
            except Exception:  # not up yet
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{what} of the Slurm cluster did not come up; see {self.root}/log")

    def start(self, timeout: float = 60.0) -> None:
        self.write_config()
        root = self.root
        if self.site:
            self.ensure_users()
            self.open_to(root)
        subprocess.run(
            ["munged", "--force", f"--socket={root}/munge/munge.socket", f"--key-file={root}/munge-key/munge.key",
             f"--pid-file={root}/munge/munged.pid", f"--log-file={root}/munge/munged.log", f"--seed-file={root}/munge/munged.seed"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        if self.accounting:
            self._start_accounting(time.monotonic() + timeout)
        self._spawn(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        for name in self.nodes:
            self._spawn(["slurmd", "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{name}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                states = {node.name: node.state for node in self.client.nodes()}
            except Exception:  # not up yet
                states = {}
            if len(states) == len(self.nodes) and all(state.startswith("IDLE") for state in states.values()):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the Slurm cluster did not come up in {timeout:.0f}s: {states}; see {root}/log")

    @property
    def health_dir(self) -> Path:
        """Where the nodes' health checks hand over their kernel lines (``SLURM_HEALTH_DIR``)."""
        return self.root / "health"

    @property
    def device_dir(self) -> Path:
        """The nodes' fake GPUs, ``<device_dir>/<node>/nvidia<N>`` (character devices 195:N)."""
        return self.root / "dev"

    def kernel_log(self, name: str) -> Path:
        """The node's (fake) kernel log, in ``/dev/kmsg``'s record format."""
        return self.root / "kmsg" / name

    @property
    def _drain_flag(self) -> Path:
        return self.root / "etc" / "drain-on-fault"

    def drain_on_fault(self, on: bool) -> None:
        """Whether each node's health check drains its own node on a fatal kernel record
        (``SATRAIN_DRAIN_ON_FAULT``), from its next check on."""
        self._drain_flag.write_text("1" if on else "0")

    def clear_health(self) -> None:
        """Every node's kernel log emptied and its health check's files removed (its cursor with
        them): the next test starts from a quiet cluster."""
        for name in self.nodes:
            self.kernel_log(name).write_text("")
        for path in self.health_dir.glob("*"):
            path.unlink(missing_ok=True)

    def kill_node(self, name: str) -> None:
        """SIGKILL one node's slurmd (its runs go on as orphans, as on a node that lost its daemon)."""
        for process in self.processes:
            args = list(process.args) if isinstance(process.args, list) else []
            if args[:4] == ["slurmd", "-D", "-N", name] and process.poll() is None:
                process.kill()
                process.wait(10)

    def start_node(self, name: str, timeout: float = 60.0) -> None:
        """Start the node's slurmd again and wait until Slurm takes work there (``resume`` if needed)."""
        self.processes = [p for p in self.processes if p.poll() is None]
        self._spawn(["slurmd", "-D", "-N", name, "-f", str(self.conf)], f"slurmd-{name}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            node = next((n for n in self.client.nodes() if n.name == name), None)
            if node is not None and node.state.startswith(("IDLE", "MIXED", "ALLOCATED")) and "*" not in node.state and "DRAIN" not in node.state:
                return
            if node is not None and "DOWN" in node.state and "*" not in node.state:
                # SlurmError: slurmd registered meanwhile and Slurm returned the node itself (ReturnToService=2)
                with contextlib.suppress(SlurmError):
                    self.client.resume(name)
            time.sleep(0.3)
        raise RuntimeError(f"slurmd of {name} did not come back in {timeout:.0f}s")

    def _spawn(self, command: list[str], name: str) -> None:
        with open(self.root / "log" / f"{name}.out", "ab") as log:
            self.processes.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True))

    # --- tear-down ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Ends every job, then every daemon (slurmd first), then munged."""
        # Jobs first, and waited for: a slurmd ended under a running job leaves its slurmstepd
        # and processes behind.
        try:
            for job in self.client.jobs():
                if job.state in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED"):
                    self.client.cancel(job.job_id)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and any(job.state in ("RUNNING", "COMPLETING") for job in self.client.jobs()):
                time.sleep(0.2)
        except Exception:  # stopping anyway
            pass
        for process in reversed(self.processes):
            process.terminate()
        for process in reversed(self.processes):
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        self.processes.clear()
        subprocess.run(["munged", "--stop", f"--socket={self.root}/munge/munge.socket"], capture_output=True, timeout=30, check=False)
