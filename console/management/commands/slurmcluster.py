"""``manage.py slurmcluster``: a one-host Slurm cluster to try ``BACKEND=slurm`` with (root, and
Debian's ``slurm-wlm`` and ``munge``): munged, slurmctld and one slurmd per node, each node with
fake GPUs, a preemptible ``spot`` partition, every file under ``VAR_DIR/slurm``. It prints the
``SLURM_CONF`` to start the console with, and runs until interrupted. ``--accounting`` also keeps
accounts (slurmdbd on a private MariaDB: ``apt-get install slurmdbd mariadb-server``), so each
project becomes a Slurm account with its GPU limit."""

from __future__ import annotations

import os
import signal
import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from jobs.backends.slurm.cluster import LocalSlurmCluster, missing_tools


class Command(BaseCommand):
    help = "Run a one-host Slurm cluster (fake GPUs) for BACKEND=slurm until interrupted."

    def add_arguments(self, parser):
        parser.add_argument("--nodes", type=int, default=3, help="nodes node-a, node-b, … (default 3)")
        parser.add_argument("--gpus", type=int, default=4, help="fake GPUs per node (default 4)")
        parser.add_argument("--accounting", action="store_true", help="keep accounts (slurmdbd, MariaDB): projects become Slurm accounts")

    def handle(self, *args, **options):
        missing = missing_tools(accounting=options["accounting"])
        if missing:
            packages = "slurm-wlm munge" + (" slurmdbd mariadb-server" if options["accounting"] else "")
            raise CommandError(f"Slurm is not installed ({', '.join(missing)} missing): apt-get install {packages}")
        if os.geteuid() != 0:
            raise CommandError("a local Slurm cluster needs root (its fake GPUs are device nodes; slurmd runs jobs as their user)")
        if not 1 <= options["nodes"] <= 26 or not 1 <= options["gpus"] <= 16:
            raise CommandError("--nodes must be 1–26 and --gpus 1–16")
        names = [f"node-{chr(ord('a') + n)}" for n in range(options["nodes"])]
        cluster = LocalSlurmCluster(settings.VAR_DIR / "slurm", nodes=names, gpus=options["gpus"], accounting=options["accounting"])
        started = time.monotonic()
        try:
            cluster.start()
        except Exception as error:
            cluster.stop()
            raise CommandError(f"the cluster did not start: {error}") from None
        self.stdout.write(
            f"Slurm cluster up in {time.monotonic() - started:.1f} s: {', '.join(names)} × {options['gpus']} GPUs, partitions gpu "
            f"(default) and spot (preemptible){'; accounts kept (sacctmgr)' if options['accounting'] else ''}.\nStart the console on it with:\n\n"
            f"  BACKEND=slurm SLURM_CONF={cluster.conf} SLURM_HEALTH_DIR={cluster.health_dir} make run\n\n"
            f"and use Slurm's commands with SLURM_CONF={cluster.conf} (sinfo, squeue, scontrol). Ctrl-C stops it."
        )
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass
        finally:
            cluster.stop()
            self.stdout.write("Slurm cluster stopped")
