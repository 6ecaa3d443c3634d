"""The backend the browser tests run on is the one they say (``make test`` runs them twice: on the
console's own agents, then with ``BROWSER_BACKEND=slurm`` on a one-host Slurm cluster): a job's
rank is a Slurm batch job exactly on the Slurm pass, and its page and log read the same."""

from __future__ import annotations

import pytest

from harness.browser import BACKEND, login

pytestmark = pytest.mark.slow

OWNER = ("backend-owner", "owner-pass-1")


def test_a_job_runs_on_the_backend_under_test_and_its_pages_read_the_same(users, page):
    console = users
    job = console.create_job(OWNER[0], "backend-check", "echo hello from the backend")
    console.wait_for_job(job["id"], "Completed", timeout=120)
    handles = console.shell(
        f"from jobs.models import AttemptNode; print(','.join(AttemptNode.objects.filter(attempt__job_id={job['id']}).values_list('backend_job', flat=True)))"
    ).strip()
    if BACKEND == "slurm":
        assert handles.isdigit(), f"not a Slurm job: {handles!r}"
    else:
        assert handles == ""
    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/training-jobs/{job['id']}/?tab=logs")
    page.wait_for_selector("text=hello from the backend")
    assert page.js_errors == []
