"""Scale-out on a Slurm cluster, as docs/deployment.md lays it out: PostgreSQL, Redis, two Daphne
processes, the Celery control worker with beat, and one ``manage.py slurmengine`` driving the
cluster (no node agent: ``nodeagent`` refuses on ``BACKEND=slurm``). A job created on one Daphne
runs as a Slurm batch job that names it, an Xid 79 on its node drains the node in Slurm and fails
the job over to another, and its page on the other Daphne says Running again."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.processes import PY, ROOT
from harness.sandbox import needs_sandbox
from harness.scaleout import Cluster, running_cluster
from harness.slurm import site_env
from jobs.backends.slurm.cluster import LocalSlurmCluster

pytestmark = [pytest.mark.scaleout, pytest.mark.slow, needs_sandbox]

COUNTER = "python -c \"import os, time\ni = 0\nwhile True:\n    print('attempt', os.environ['JOB_ATTEMPT'], 'line', i, flush=True); i += 1; time.sleep(0.05)\""


class SlurmScaleOut(Cluster):
    """The scale-out console whose nodes are a Slurm cluster's, driven by ``slurmengine``."""

    def __init__(self, tmp: Path, pg_url: str, redis_url: str, slurm: LocalSlurmCluster) -> None:
        super().__init__(tmp, pg_url, redis_url)
        self.slurm = slurm
        self.env.update(site_env(slurm), SLURM_POLL_INTERVAL="0.5", SLURM_SPOT_PARTITION="spot", SIMULATED_GPUS="1")

    def start(self) -> None:
        super().start()
        self.spawn("slurmengine", [PY, "manage.py", "slurmengine"])

    def start_agent(self, name: str) -> None:
        """No node agent on Slurm's nodes: ``slurmengine`` serves them all."""


@pytest.fixture
def cluster(tmp_path: Path, slurm_cluster: LocalSlurmCluster) -> Iterator[SlurmScaleOut]:
    from harness.slurm import reset

    yield from running_cluster(lambda tmp, pg, redis: SlurmScaleOut(tmp, pg, redis, slurm_cluster), tmp_path)
    reset(slurm_cluster)


def test_a_node_agent_refuses_on_slurm_and_the_slurm_engine_drives_the_cluster_in_scale_out(cluster):
    refused = subprocess.run(
        [PY, "manage.py", "nodeagent", "--name", "node-a"], check=False, cwd=ROOT, env=cluster.env, capture_output=True, text=True, timeout=60
    )
    assert refused.returncode != 0 and "slurmengine" in refused.stderr, refused.stderr[-500:]
    first, second = cluster.ports
    token = cluster.api(first, "POST", "/api/v1/auth/token/", body={"username": "admin", "password": "admin-pass-1"})[1]["token"]
    cluster.wait(
        lambda: len([n for n in cluster.api(first, "GET", "/api/v1/nodes/", token)[1]["results"] if n["state"] == "Ready"]) == 3, "3 Slurm nodes Ready"
    )
    status, job = cluster.api(first, "POST", "/api/v1/training-jobs/", token, {"name": "on-slurm", "command": COUNTER, "gpus_per_node": 1})
    assert status == 201, job

    def attempt(n: int):
        rows = cluster.api(second, "GET", f"/api/v1/training-jobs/{job['id']}/attempts/", token)[1]
        return next((a for a in rows if a["number"] == n and a["state"] == "running"), None)

    one = cluster.wait(lambda: attempt(1), "attempt 1 running", timeout=120)
    # (The session's cluster still lists other tests' ended jobs, whose consoles had a job 1 too.)
    batch = [j for j in cluster.slurm.client.jobs() if j.record.get("Comment", "").startswith(f"satrain:job={job['id']}:attempt=1:") and j.state == "RUNNING"]
    assert len(batch) == 1 and batch[0].nodes == one["nodes"], (batch, one)
    node_one, gpu = one["nodes"][0], one["placements"][0]["gpu_indices"][0]
    assert cluster.api(first, "POST", f"/api/v1/nodes/{node_one}/inject-fault/", token, {"gpu": gpu, "xid": 79})[0] == 201
    two = cluster.wait(lambda: attempt(2), "attempt 2 running after the fault", timeout=120)
    assert two["nodes"][0] != node_one
    drained = next(n for n in cluster.slurm.client.nodes() if n.name == node_one)
    assert "DRAIN" in drained.state and "Xid 79" in drained.reason, drained
    assert cluster.api(second, "GET", f"/api/v1/training-jobs/{job['id']}/", token)[1]["status"] == "Running"
    assert cluster.api(first, "POST", f"/api/v1/training-jobs/{job['id']}/stop/", token)[0] == 200
    cluster.wait(lambda: cluster.api(second, "GET", f"/api/v1/training-jobs/{job['id']}/", token)[1]["status"] == "Stopped", "Stopped", timeout=60)
