"""The simulated fleet against the real control plane (PostgreSQL, Redis, the Celery control
worker with beat): 50 node agents in one process (``bench.scale.fleet``). A heartbeat storm (every
agent restarting at once, again and again, while control rounds run) marks no node NotReady; a
mass heartbeat loss is taken as an outage, not 30 lost nodes; one node gone silent is lost after
the timeout and its job fails over."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from harness.processes import PY, ROOT
from harness.scaleout import Cluster, control_worker, running_cluster

pytestmark = pytest.mark.slow

NODES = 50
TIMEOUT = 6  # NODE_HEARTBEAT_TIMEOUT of the cluster: seconds


class FleetCluster(Cluster):
    def __init__(self, tmp: Path, pg: str, rd: str) -> None:
        super().__init__(tmp, pg, rd)
        self.env.update({"NODE_HEARTBEAT_TIMEOUT": str(TIMEOUT), "STOP_GRACE_PERIOD": "2"})
        self.silence = tmp / "silence"

    def start(self) -> None:
        import redis

        redis.Redis.from_url(self.env["REDIS_URL"]).flushdb()
        self.sql(f'CREATE DATABASE "{self.db_name}"')
        subprocess.run([PY, "manage.py", "bootstrap", "--no-nodes"], cwd=ROOT, env=self.env, check=True, capture_output=True)
        self.spawn(
            "control",
            control_worker(self.tmp),
        )
        self.spawn(
            "fleet",
            [
                PY,
                "-m",
                "bench.scale.fleet",
                "--nodes",
                str(NODES),
                "--gpus",
                "2",
                "--prefix",
                "fleet-",
                "--run-seconds",
                "600",
                "--silence-file",
                str(self.silence),
            ],
        )
        self.wait(lambda: "ready 50" in self.log("fleet"), "the fleet", timeout=120)

    def log(self, key: str) -> str:
        try:
            return (self.tmp / f"{key}.log").read_text(errors="replace")
        except OSError:
            return ""

    def query(self, sql: str, params: list | None = None) -> list[tuple]:
        import psycopg

        url = self.env["DATABASE_URL"].replace("postgres://", "postgresql://")
        with psycopg.connect(url, autocommit=True) as conn:
            return conn.execute(sql, params or []).fetchall()

    def not_ready(self) -> list[str]:
        return [r[0] for r in self.query("SELECT name FROM jobs_node WHERE state = 'NotReady' ORDER BY name")]

    def manage(self, code: str) -> str:
        done = subprocess.run([PY, "manage.py", "shell", "-c", code], check=False, cwd=ROOT, env=self.env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    yield from running_cluster(FleetCluster, tmp_path_factory.mktemp("fleet"))


def test_every_agent_restarting_at_once_marks_no_healthy_node_not_ready(fleet):
    # On a loaded machine a node may miss its first beats while 50 agents start, be taken as
    # lost and come back with its next beat: the storms begin from a fleet that is all Ready.
    fleet.wait(lambda: fleet.query("SELECT count(*) FROM jobs_node WHERE state = 'Ready'") == [(NODES,)], "every node Ready", timeout=60)
    end = time.monotonic() + 3 * TIMEOUT
    storms = 0
    while time.monotonic() < end:  # control rounds sweep every second meanwhile
        os.kill(fleet.procs["fleet"].pid, signal.SIGUSR1)
        storms += 1
        for _ in range(20):
            assert fleet.not_ready() == []
            time.sleep(0.1)
    fleet.wait(lambda: fleet.log("fleet").count("restarted 50") >= storms - 1, "the restarts", timeout=60)
    assert fleet.not_ready() == []


def test_a_mass_heartbeat_loss_is_taken_as_an_outage_not_as_lost_nodes(fleet):
    silent = [f"fleet-{i:04d}" for i in range(1, 31)]  # 30 of 50: over NODE_LOST_MAX_FRACTION
    fleet.silence.write_text("\n".join(silent))
    try:
        fleet.wait(lambda: "mass heartbeat loss" in fleet.log("control"), "the outage to be noticed", timeout=4 * TIMEOUT)
        assert fleet.not_ready() == []
    finally:
        fleet.silence.unlink()
    time.sleep(TIMEOUT + 2)  # beats resume: every node gets a fresh full timeout, none is marked
    assert fleet.not_ready() == []


def test_a_node_silent_past_the_timeout_is_lost_and_its_job_fails_over(fleet):
    job_id = int(
        fleet.manage(
            "from django.contrib.auth import get_user_model; from jobs.services.creation import create_job; "
            "print(create_job(owner=get_user_model().objects.get(username='admin'), name='fleet-job', image=__import__('django.conf').conf.settings.DEFAULT_IMAGE, "
            "command='python train.py', gpus_per_node=1, node_count=1).pk)"
        )
    )

    def placed_on() -> str | None:
        rows = fleet.query(
            "SELECT n.name FROM jobs_attemptnode p JOIN jobs_jobattempt a ON a.id = p.attempt_id JOIN jobs_node n ON n.id = p.node_id "
            "WHERE a.job_id = %s AND a.state = 'running' ORDER BY a.number DESC",
            [job_id],
        )
        return rows[0][0] if rows else None

    fleet.wait(lambda: placed_on() is not None, "the job to run", timeout=60)
    node = placed_on()
    fleet.silence.write_text(node)
    silenced = time.monotonic()
    try:
        fleet.wait(lambda: node in fleet.not_ready(), f"{node} to be lost", timeout=TIMEOUT + 15)
        detected = time.monotonic() - silenced
        # Its last beat was at most one beat interval (TIMEOUT / 3) before the silence began.
        assert TIMEOUT - TIMEOUT / 3 - 1 <= detected <= TIMEOUT + 5
        fleet.wait(lambda: (placed_on() or node) != node, "the job to fail over to another node", timeout=60)
    finally:
        fleet.silence.unlink()
    [(failovers, status)] = fleet.query("SELECT failover_count, status FROM jobs_trainingjob WHERE id = %s", [job_id])
    assert failovers == 1 and status == "Running"
    fleet.wait(lambda: node not in fleet.not_ready(), f"{node} to come back once it beats again", timeout=30)
