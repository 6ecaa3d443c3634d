"""The guide's Spot script as written (``TrainingArguments(output_dir="./results")``, a save every
20 steps) in its container: an Xid 79 on its GPU fails it over, attempt 2 resumes from the last
step it committed in ``./results`` (the run's work directory) — or, with checkpointless failover,
from the newest step the Trainer's state was copied to another node's memory — the Failover tab
says which, and the training continues from there. A run that commits where nothing survives is
warned about on its page while it runs."""

from __future__ import annotations

import ast
import os
import re

import pytest

from harness.browser import login, save_screenshot
from harness.processes import wait
from harness.sandbox import needs_sandbox
from harness.spot import ENV, SPOT

pytestmark = [pytest.mark.slow, needs_sandbox]

OWNER = ("spot-resume-owner", "owner-pass-1")


LOGGED = re.compile(r"\{'loss': [^}]*\}")


def logged_epochs(lines: list[str]) -> list[float]:
    """The epoch of each of the Trainer's loss dicts (``{'loss': 5.149, …, 'epoch': 0.09}``)."""
    return [float(ast.literal_eval(m.group(0))["epoch"]) for line in lines if (m := LOGGED.search(line))]


def checkpoints(console, job_id: int) -> list[dict]:
    return console.shell_json(
        "import json; from logs.models import Checkpoint; "
        f"print(json.dumps(list(Checkpoint.objects.filter(job_id={job_id}).order_by('attempt', 'step').values('attempt', 'step', 'path'))))"
    )


def attempt_facts(console, job_id: int) -> list[dict]:
    return console.shell_json(
        "import json; from jobs.models import AttemptNode; "
        f"print(json.dumps([dict(n=p.attempt.number, node=p.node.name, gpus=p.gpu_indices, resume=p.attempt.resume_step) "
        f"for p in AttemptNode.objects.filter(attempt__job_id={job_id}).select_related('attempt', 'node').order_by('attempt__number')]))"
    )


def fault_with_a_replica_ahead_of_the_disk(console, job_id: int, node: str, gpu: int) -> dict:
    """An Xid 79 on the job's GPU once another node's memory holds a step newer than the disk's
    newest checkpoint and the next save (every 20 steps) is at least 9 steps away: read and
    injected in one process, so no save can come between (a fault right after a save would
    find the disk as new as the replica, and the disk is then the one resumed from)."""
    return console.shell_json(
        f"""
import json, time
from agent.models import Replica
from failover.services.faults import inject_fault
from jobs.models import Node
from logs.models import Checkpoint
deadline = time.monotonic() + 90
while True:
    replica = Replica.objects.filter(job_id={job_id}).order_by("-step").values_list("step", flat=True).first() or 0
    disk = Checkpoint.objects.filter(job_id={job_id}).order_by("-step").values_list("step", flat=True).first() or 0
    if (replica > disk and 1 <= replica % 20 <= 11) or time.monotonic() > deadline:
        break
    time.sleep(0.1)
inject_fault(Node.objects.get(name={node!r}), gpu={gpu}, xid=79, actor="test")
print(json.dumps(dict(replica=replica, disk=disk)))
"""
    )


def log_lines(console, job_id: int, attempt: int) -> list[str]:
    return console.shell_json(
        "import json; from logs.models import LogLine; "
        f"print(json.dumps(list(LogLine.objects.filter(job_id={job_id}, stream='master', attempt={attempt}).order_by('seq').values_list('text', flat=True))))"
    )


def test_the_guides_spot_script_resumes_from_its_results_directory_after_an_xid_79(users, page):
    console = users
    job = console.create_job(OWNER[0], "spot-results", SPOT, env=ENV, checkpointless=False)
    console.wait_for_job(job["id"], "Running", timeout=300)
    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/training-jobs/{job['id']}/?tab=checkpoints")
    wait(lambda: len(checkpoints(console, job["id"])) >= 2, "two committed checkpoints", timeout=600, interval=1)
    committed = checkpoints(console, job["id"])
    assert all(c["path"].startswith("/job/work/results/concurrent_checkpoint/checkpoint-") for c in committed), committed
    # ./results is the job's own storage: no warning that its checkpoints would be lost.
    assert page.locator("[data-checkpoint-warning]").is_hidden()

    [first] = attempt_facts(console, job["id"])
    last_before = max(c["step"] for c in committed)
    console.inject_fault(first["node"], gpu=first["gpus"][0], xid=79)
    try:
        wait(lambda: any(c["attempt"] == 2 for c in checkpoints(console, job["id"])), "attempt 2's first commit", timeout=600, interval=1)
        facts = attempt_facts(console, job["id"])
        assert [f["n"] for f in facts] == [1, 2], facts
        second = facts[-1]
        assert second["node"] != first["node"] or second["gpus"] != first["gpus"]
        assert second["resume"] is not None and second["resume"] >= last_before and second["resume"] % 20 == 0

        page.goto(f"{console.base_url}/training-jobs/{job['id']}/?tab=failover")
        resumed = page.locator("[data-failover-timeline] > li[data-attempt='2']")
        assert f"checkpoint step {second['resume']} in /job/work/results/concurrent_checkpoint" in resumed.inner_text()
        assert "hardware fault" in page.locator("[data-failover-timeline] > li[data-attempt='1']").inner_text()
        save_screenshot(page, "spot-resume-failover-tab", full_page=True)

        # Training continues: attempt 2 loads that checkpoint, and its first save is 20 steps on
        # from it (a run from the start would commit step 20 first).
        again = log_lines(console, job["id"], 2)
        assert any(f"/job/work/results/concurrent_checkpoint/checkpoint-{second['resume']}" in line for line in again), again[-30:]
        later = [c["step"] for c in checkpoints(console, job["id"]) if c["attempt"] == 2]
        assert min(later) == second["resume"] + 20, later
        # And the loss curve goes on from there: attempt 2's first logged loss is at a later epoch
        # than attempt 1's first (a run from the start would log at attempt 1's first epoch again).
        epochs_one, epochs_two = logged_epochs(log_lines(console, job["id"], 1)), logged_epochs(again)
        assert epochs_one and epochs_two and epochs_two[0] > epochs_one[0], (epochs_one[:3], epochs_two[:3])
        assert page.js_errors == []
        console.api("POST", f"/api/v1/training-jobs/{job['id']}/stop/", user=OWNER[0])
        console.wait_for_job(job["id"], "Stopped", timeout=120)
    finally:
        console.shell(f"from jobs.models import Node; from failover.services.faults import clear_node; clear_node(Node.objects.get(name={first['node']!r}))")


@pytest.mark.skipif(os.environ.get("BROWSER_BACKEND") == "slurm", reason="Slurm runs its ranks beside no agent: no replicas there (docs/failover.md)")
def test_with_checkpointless_failover_the_guides_spot_script_resumes_from_the_step_in_another_nodes_memory(users, page):
    console = users
    job = console.create_job(OWNER[0], "spot-replica", SPOT, env=ENV)
    assert job["checkpointless"] is True  # the default
    console.wait_for_job(job["id"], "Running", timeout=300)
    wait(lambda: len(checkpoints(console, job["id"])) >= 1, "a committed checkpoint", timeout=600, interval=1)
    [first] = attempt_facts(console, job["id"])
    at_fault = fault_with_a_replica_ahead_of_the_disk(console, job["id"], first["node"], first["gpus"][0])
    try:
        wait(lambda: any(c["attempt"] == 2 for c in checkpoints(console, job["id"])), "attempt 2's first commit", timeout=600, interval=1)
        second = attempt_facts(console, job["id"])[-1]
        last_disk = max(c["step"] for c in checkpoints(console, job["id"]) if c["attempt"] == 1)
        assert second["resume"] is not None and second["resume"] > last_disk, (second, last_disk, at_fault)  # newer than the disk had

        login(page, console, *OWNER)
        page.goto(f"{console.base_url}/training-jobs/{job['id']}/?tab=failover")
        resumed = page.locator("[data-failover-timeline] > li[data-attempt='2'] [data-field='resumed-from']").inner_text()
        assert f"the in-memory replica of step {second['resume']}" in resumed and f"the disk checkpoint had step {last_disk}" in resumed
        save_screenshot(page, "spot-replica-failover-tab", full_page=True)
        # The Trainer loaded it (ckptlib's own check passed) and went on: its first save is the
        # next multiple of 20, and its loss dicts go on at later epochs.
        again = log_lines(console, job["id"], 2)
        assert f"[Concurrent Checkpoint] resuming from the in-memory replica step={second['resume']}" in "\n".join(again), again[-30:]
        later = [c["step"] for c in checkpoints(console, job["id"]) if c["attempt"] == 2]
        assert min(later) == (second["resume"] // 20 + 1) * 20, later
        epochs_one, epochs_two = logged_epochs(log_lines(console, job["id"], 1)), logged_epochs(again)
        assert epochs_one and epochs_two and epochs_two[0] > epochs_one[-1] - 0.05, (epochs_one[-3:], epochs_two[:3])
        assert page.js_errors == []
        console.api("POST", f"/api/v1/training-jobs/{job['id']}/stop/", user=OWNER[0])
        console.wait_for_job(job["id"], "Stopped", timeout=120)
    finally:
        console.shell(f"from jobs.models import Node; from failover.services.faults import clear_node; clear_node(Node.objects.get(name={first['node']!r}))")


def test_a_running_job_that_commits_outside_its_storage_is_warned_about_live(users, page):
    console = users
    job = console.create_job(
        OWNER[0], "ckpt-in-tmp", "python -m jobs.examples.train_ckpt --steps 100000 --save-every 10 --sleep 0.05 --output-dir /tmp/scratch"
    )
    console.wait_for_job(job["id"], "Running", timeout=300)
    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/training-jobs/{job['id']}/")
    warning = page.locator("[data-checkpoint-warning]")
    try:
        # Shown by the live page as the first commit line arrives (or by the page if it came first).
        warning.wait_for(state="visible", timeout=120_000)
        assert "/tmp/scratch/concurrent_checkpoint/checkpoint-" in warning.inner_text()
        assert "lost when the job is re-placed" in warning.inner_text()
        save_screenshot(page, "checkpoints-outside-storage-warning")
    finally:
        console.api("POST", f"/api/v1/training-jobs/{job['id']}/stop/", user=OWNER[0])
    console.wait_for_job(job["id"], "Stopped", timeout=60)
    page.reload()
    assert page.locator("[data-checkpoint-warning]").is_hidden()
    assert page.js_errors == []
