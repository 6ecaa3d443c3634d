"""After a stop, "Resume" starts a new attempt from the last committed checkpoint: the run is told
CKPT_LAST_STEP and its training continues from that step, not from the start."""

from __future__ import annotations

import re

import pytest

from harness.browser import login
from harness.processes import wait

pytestmark = pytest.mark.slow

OWNER = ("resume-owner", "owner-pass-1")
TRAINING = "python -m jobs.examples.train_ckpt --steps 600 --save-every 10 --sleep 0.03"


def log_text(console, job_id: int) -> str:
    status, page = console.api("GET", f"/api/v1/training-jobs/{job_id}/logs/?limit=2000", user=OWNER[0])
    assert status == 200, (status, page)
    return "\n".join(line["text"] for line in page["lines"])


def committed_steps(console, job_id: int) -> list[int]:
    out = console.shell_json(
        f"import json; from logs.models import Checkpoint; print(json.dumps(list(Checkpoint.objects.filter(job_id={job_id}).order_by('step').values_list('step', flat=True))))"
    )
    return out


def test_resume_continues_a_stopped_job_from_its_checkpoint_step(users, page):
    console = users
    job = console.create_job(OWNER[0], "resume-me", TRAINING)
    console.wait_for_job(job["id"], "Running", timeout=60)
    wait(lambda: len(committed_steps(console, job["id"])) >= 2, "two committed checkpoints", timeout=60)

    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/training-jobs/{job['id']}/")
    page.on("dialog", lambda dialog: dialog.accept())
    page.locator("[data-action='stop'] button").click()
    page.locator(".job-header .badge__text", has_text="Stopped").wait_for(timeout=60_000)
    last = max(committed_steps(console, job["id"]))

    resume = page.locator("[data-action='resume'] button")
    resume.wait_for(timeout=10_000)
    assert re.search(r"Resume from step \d+", resume.inner_text())
    resume.click()
    page.wait_for_selector(".message--success:has-text('resumes from checkpoint step')")
    console.wait_for_job(job["id"], {"Running", "Completed"}, timeout=60)
    attempts = console.attempts(job["id"])
    assert len(attempts) == 2
    # The resumed run's first step line, not only its "Resumed" line: lines are stored in batches.
    resumed_step = re.compile(r"Resumed from checkpoint step \d+.*?step \d+/600", re.S)
    text = wait(lambda: (t := log_text(console, job["id"])) and resumed_step.search(t) and t, "the resumed run's first step", timeout=60)
    resumed_at = int(re.search(r"Resumed from checkpoint step (\d+)", text).group(1))
    assert resumed_at >= last > 0
    # The second attempt's first training step is the one after the checkpoint, not step 1.
    second = text.split(f"Resumed from checkpoint step {resumed_at}", 1)[1]
    first_step = int(re.search(r"step (\d+)/600", second).group(1))
    assert first_step == resumed_at + 1
    page.locator(".job-header .badge__text", has_text="Running").or_(page.locator(".job-header .badge__text", has_text="Completed")).wait_for(timeout=30_000)
    page.locator("[data-action='stop'] button").click()
    console.wait_for_job(job["id"], "Stopped", timeout=60)
    assert page.js_errors == []
