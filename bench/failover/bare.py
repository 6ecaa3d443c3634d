"""The baseline of the console's launch on Slurm, measured in the same run: a bare ``sbatch`` of a
one-line batch job (one GPU as GRES, no container, no console) → its first line in its output
file. The console's ``placed → Running`` is then read against it (issue 44: at most 1 s over)."""

from __future__ import annotations

import time
from pathlib import Path

from harness.slurm import account_dir
from jobs.backends.slurm.client import Submission
from jobs.backends.slurm.cluster import LocalSlurmCluster

TIMEOUT_S = 60.0


def bare_sbatch(cluster: LocalSlurmCluster, runs: int, workdir: Path) -> list[float]:
    """Seconds from each ``sbatch`` call to its job's first line, one job after the other."""
    account_dir(cluster, workdir)  # its jobs run as the cluster's service account
    seconds = []
    for n in range(runs):
        output = workdir / f"bare-{n}.out"
        start = time.monotonic()
        submission = Submission(
            name=f"bare-{n}", user=cluster.user, script="#!/bin/bash\necho first\n", output=str(output), workdir=str(workdir), gpus_per_node=1
        )
        cluster.client.submit(submission)
        while not (output.exists() and b"first" in output.read_bytes()):
            if time.monotonic() - start > TIMEOUT_S:
                raise TimeoutError(f"bare sbatch {n}: no first line in {TIMEOUT_S:.0f} s")
            time.sleep(0.002)
        seconds.append(time.monotonic() - start)
    return seconds
