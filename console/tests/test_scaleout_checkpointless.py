"""Checkpointless failover across real node agents (PostgreSQL, Redis, the control worker and an
agent process per node): a node dies with its agent and its run while the job's newest state is
held in another node's agent's memory, and the job goes on on a third node from that state, its
losses the same, bit for bit, as an uninterrupted run's."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest

from agent import runfiles
from harness.scaleout import Cluster, running_cluster

pytestmark = [pytest.mark.scaleout, pytest.mark.slow]

STEPS = 300
TRAINING = f"python -m jobs.examples.train_ckpt --steps {STEPS} --save-every 100000 --sleep 0.05"
STEP = re.compile(r"^step (\d+)/\d+ loss (\S+)$")


class ReplicaCluster(Cluster):
    def __init__(self, tmp: Path, pg: str, rd: str) -> None:
        super().__init__(tmp, pg, rd)
        self.env.update({"SNAPSHOT_ROOT": str(tmp / "shm"), "REPLICA_ADDRESS": "127.0.0.1:0"})

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        import psycopg

        url = self.env["DATABASE_URL"].replace("postgres://", "postgresql://")
        with psycopg.connect(url, autocommit=True) as conn:
            return conn.execute(sql, params or []).fetchall()


@pytest.fixture
def cluster(tmp_path):
    yield from running_cluster(ReplicaCluster, tmp_path)


def test_a_node_killed_with_its_agent_resumes_on_a_third_node_from_the_replica_bit_for_bit(cluster):
    api_port = cluster.ports[0]
    status, body = cluster.api(api_port, "POST", "/api/v1/auth/token/", body={"username": "admin", "password": "admin-pass-1"})
    assert status == 200, body
    token = body["token"]
    cluster.wait(lambda: len(cluster.query("SELECT 1 FROM agent_replicaendpoint")) == 3, "every agent's replica endpoint")
    status, job = cluster.api(api_port, "POST", "/api/v1/training-jobs/", token, {"name": "no-ckpt", "command": TRAINING, "gpus_per_node": 1})
    assert status == 201, job
    job_id = job["id"]

    def replica() -> tuple | None:
        rows = cluster.query(
            "SELECT r.step, n.name FROM agent_replica r JOIN jobs_node n ON n.id = r.holder_id WHERE r.job_id = %s ORDER BY r.step DESC", [job_id]
        )
        return rows[0] if rows and rows[0][0] >= 40 else None

    step, holder = cluster.wait(replica, "a replica past step 40", timeout=120)
    first = cluster.query(
        "SELECT n.name FROM jobs_attemptnode p JOIN jobs_jobattempt a ON a.id = p.attempt_id JOIN jobs_node n ON n.id = p.node_id WHERE a.job_id = %s AND a.number = 1",
        [job_id],
    )[0][0]
    assert holder != first  # the replica is in another node's memory
    third = ({"node-a", "node-b", "node-c"} - {first, holder}).pop()
    # The holder takes no new work (it still holds and serves the replica): the job must go to the third node.
    assert cluster.api(api_port, "POST", f"/api/v1/nodes/{holder}/cordon/", token)[0] == 200

    # The node dies: its agent and its run, at once.
    run = runfiles.read_pid(Path(cluster.env["JOB_WORK_ROOT"]) / str(job_id) / "attempt-1" / "rank-0")
    assert run is not None and run.pgid
    cluster.kill(f"agent-{first}")
    os.killpg(run.pgid, signal.SIGKILL)

    def finished() -> bool:
        return cluster.api(api_port, "GET", f"/api/v1/training-jobs/{job_id}/", token)[1]["status"] == "Completed"

    cluster.wait(finished, "the job's end on the third node", timeout=240)
    source, resumed, detail, node = cluster.query(
        "SELECT a.resume_source, a.resume_step, a.resume_detail, n.name FROM jobs_jobattempt a JOIN jobs_attemptnode p ON p.attempt_id = a.id "
        "JOIN jobs_node n ON n.id = p.node_id WHERE a.job_id = %s AND a.number = 2",
        [job_id],
    )[0]
    assert (source, node) == ("replica", third), detail
    assert resumed >= step and f"held in memory on {holder}" in detail
    lines = cluster.query("SELECT attempt, text FROM logs_logline WHERE job_id = %s AND stream = 'master' ORDER BY seq", [job_id])
    printed = {1: {}, 2: {}}
    for attempt, text in lines:
        m = STEP.match(text)
        if m:
            printed[attempt][int(m.group(1))] = m.group(2)
    assert min(printed[2]) == resumed + 1 and max(printed[2]) == STEPS
    # An uninterrupted run of the same job, on the same image and host: the same losses, bit for bit.
    assert cluster.api(api_port, "POST", f"/api/v1/nodes/{holder}/uncordon/", token)[0] == 200
    status, plain = cluster.api(api_port, "POST", "/api/v1/training-jobs/", token, {"name": "uninterrupted", "command": TRAINING, "gpus_per_node": 1})
    assert status == 201, plain
    cluster.wait(
        lambda: cluster.api(api_port, "GET", f"/api/v1/training-jobs/{plain['id']}/", token)[1]["status"] == "Completed", "the uninterrupted run", timeout=180
    )
    reference = {}
    for (text,) in cluster.query("SELECT text FROM logs_logline WHERE job_id = %s AND stream = 'master' ORDER BY seq", [plain["id"]]):
        if m := STEP.match(text):
            reference[int(m.group(1))] = m.group(2)
    assert len(reference) == STEPS
    assert all(printed[1][s] == reference[s] for s in printed[1])
    assert all(printed[2][s] == reference[s] for s in printed[2]), "the resumed run's losses differ from an uninterrupted run's"
    # The replicas end with the job (the holder's sweep, within its interval).
    cluster.wait(lambda: not cluster.query("SELECT 1 FROM agent_replica WHERE job_id = %s", [job_id]), "the replicas dropped", timeout=30)
