"""Scale-out (PostgreSQL, Redis, two Daphne processes, a control worker, three node agents as
separate processes sharing JOB_WORK_ROOT as a cluster shares a file system): the guide's Spot script
with its own ``output_dir="./results"`` fails over on an Xid 79 to another node's agent, which
resumes it from the last step committed in ``./results``; Chromium reads that on the Failover tab
served by the other Daphne."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

import ckptlib
from harness.browser import login, save_screenshot
from harness.sandbox import needs_sandbox
from harness.spot import ENV, SPOT

pytestmark = [pytest.mark.scaleout, pytest.mark.slow, needs_sandbox]


def test_the_spot_script_resumes_from_results_on_another_nodes_agent(scaleout_cluster, page):
    first, second = scaleout_cluster.ports
    status, body = scaleout_cluster.api(first, "POST", "/api/v1/auth/token/", body={"username": "admin", "password": "admin-pass-1"})
    assert status == 200, body
    token = body["token"]
    scaleout_cluster.wait(
        lambda: len([n for n in scaleout_cluster.api(first, "GET", "/api/v1/nodes/", token)[1]["results"] if n["state"] == "Ready"]) == 3, "3 ready nodes"
    )
    status, job = scaleout_cluster.api(
        first, "POST", "/api/v1/training-jobs/", token, {"name": "spot-scale", "command": SPOT, "env": ENV, "gpus_per_node": 1, "checkpointless": False}
    )
    assert status == 201, job
    job_id = job["id"]

    def attempt(n: int):
        rows = scaleout_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/attempts/", token)[1]
        found = [a for a in rows if a["number"] == n and a["state"] == "running"]
        return found[0] if found else None

    def commits(n: int) -> list[ckptlib.CommitEvent]:
        found, after = [], 0
        while True:
            page_ = scaleout_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/logs/?after={after}&limit=5000", token)[1]
            found += [e for line in page_["lines"] if line["attempt"] == n and (e := ckptlib.parse_commit_line(line["text"]))]
            if not page_["has_more"]:
                return found
            after = page_["next_after"]

    one = scaleout_cluster.wait(lambda: attempt(1), "attempt 1 running", timeout=300)
    before = scaleout_cluster.wait(lambda: (c := commits(1)) and len(c) >= 2 and c, "two commits of attempt 1", timeout=600)
    assert all(e.path.startswith("/job/work/results/concurrent_checkpoint/checkpoint-") for e in before)
    node_one = one["nodes"][0]
    gpu = one["placements"][0]["gpu_indices"][0]
    assert scaleout_cluster.api(first, "POST", f"/api/v1/nodes/{node_one}/inject-fault/", token, {"gpu": gpu, "xid": 79})[0] == 201
    two = scaleout_cluster.wait(lambda: attempt(2), "attempt 2 running after the fault", timeout=300)
    assert two["nodes"][0] != node_one
    after = scaleout_cluster.wait(lambda: commits(2), "attempt 2's first commit", timeout=600)

    page.goto(f"http://127.0.0.1:{second}/")  # the other Daphne
    login(page, SimpleNamespace(base_url=f"http://127.0.0.1:{second}"), "admin", "admin-pass-1")
    page.goto(f"http://127.0.0.1:{second}/training-jobs/{job_id}/?tab=failover")
    text = page.locator("[data-failover-timeline] > li[data-attempt='2']").inner_text()
    found = re.search(r"checkpoint step (\d+) in /job/work/results/concurrent_checkpoint", text)
    assert found, text
    step = int(found.group(1))
    assert step >= max(e.step for e in before) and step % 20 == 0
    # The other node's agent found ./results where the first left it, and training went on from there.
    assert after[0].step == step + 20, [e.step for e in after]
    save_screenshot(page, "scaleout-spot-resume-failover-tab", full_page=True)
    assert page.js_errors == []

    assert scaleout_cluster.api(first, "POST", f"/api/v1/training-jobs/{job_id}/stop/", token)[0] == 200
    scaleout_cluster.wait(
        lambda: scaleout_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/", token)[1]["status"] == "Stopped", "Stopped", timeout=120
    )
