"""docs/deployment.md followed as written: deploy/Procfile's processes started by honcho from an
env file made from deploy/console.env.example, the release step before them, against PostgreSQL
and Redis on loopback. They stay up, both Daphnes serve, and a job fails over across agents and
completes."""

from __future__ import annotations

import os

import pytest

from harness.scaleout import HONCHO, ProcfileCluster, env_file_from_example, running_cluster

pytestmark = [pytest.mark.scaleout, pytest.mark.slow]

# Attempt 1 prints until its GPU faults; attempt 2 prints 20 lines and exits 0.
TWO_ATTEMPTS = (
    'python -c "import os, time\n'
    "n = int(os.environ['JOB_ATTEMPT'])\n"
    "for i in range(100000 if n == 1 else 20):\n"
    "    print('attempt', n, 'line', i, flush=True); time.sleep(0.05)\""
)


@pytest.fixture
def procfile_cluster(tmp_path):
    """The cluster as docs/deployment.md starts it (``ProcfileCluster``: honcho and deploy/Procfile),
    not the scale-out tests' ``scaleout_cluster``; skipped (failed with ``REQUIRE_SCALEOUT``) without
    honcho."""
    if not HONCHO.exists():
        message = f"{HONCHO} is missing: the dev extras install it (make test)"
        if os.environ.get("REQUIRE_SCALEOUT"):
            pytest.fail(message)
        pytest.skip(message)
    yield from running_cluster(ProcfileCluster, tmp_path)


def test_the_env_file_keeps_the_examples_lines_and_sets_the_given_values():
    text = env_file_from_example({"SECRET_KEY": "s3cret", "EXTRA": "1"})
    assert "SECRET_KEY=s3cret\n" in text and "SECRET_KEY=change-me" not in text
    assert text.endswith("EXTRA=1\n")
    assert "# /etc/console/env" in text


def test_the_procfiles_processes_stay_up_serve_and_fail_a_job_over(procfile_cluster):
    first, second = procfile_cluster.ports
    status, body = procfile_cluster.api(first, "POST", "/api/v1/auth/token/", body={"username": "admin", "password": "admin-pass-1"})
    assert status == 200, body
    token = body["token"]
    procfile_cluster.wait(
        lambda: len([n for n in procfile_cluster.api(second, "GET", "/api/v1/nodes/", token)[1]["results"] if n["state"] == "Ready"]) == 3,
        "3 ready nodes",
        timeout=120,
    )

    status, job = procfile_cluster.api(first, "POST", "/api/v1/training-jobs/", token, {"name": "procfile", "command": TWO_ATTEMPTS, "gpus_per_node": 1})
    assert status == 201, job
    job_id = job["id"]

    def attempt(n: int):
        rows = procfile_cluster.api(second, "GET", f"/api/v1/training-jobs/{job_id}/attempts/", token)[1]
        found = [a for a in rows if a["number"] == n and a["state"] in ("running", "exited")]
        return found[0] if found else None

    one = procfile_cluster.wait(lambda: attempt(1), "attempt 1 running", timeout=120)
    node_one, gpu = one["nodes"][0], one["placements"][0]["gpu_indices"][0]
    assert procfile_cluster.api(first, "POST", f"/api/v1/nodes/{node_one}/inject-fault/", token, {"gpu": gpu, "xid": 79})[0] == 201
    two = procfile_cluster.wait(lambda: attempt(2), "attempt 2 after the fault", timeout=120)
    assert two["nodes"][0] != node_one
    procfile_cluster.wait(
        lambda: procfile_cluster.api(second, "GET", f"/api/v1/training-jobs/{job_id}/", token)[1]["status"] == "Completed", "Completed", timeout=120
    )

    history = procfile_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/events/", token)[1]
    events = [e["to_status"] for e in history if e["from_status"] != e["to_status"]]
    assert events == ["Pending", "Running", "Pending - failoverinprogress", "Running", "Completed"]
    # Every process honcho started still runs: none exited and took the others down with it.
    assert procfile_cluster.exited() == []
    assert all(procfile_cluster.http_ok(port) for port in procfile_cluster.ports)
    # The two Daphnes share the metrics directory the Procfile names.
    assert any((procfile_cluster.tmp / "prometheus").iterdir())
