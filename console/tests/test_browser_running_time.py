"""In Chromium, the running time the list and the detail page count between live updates is what
the job's attempts ran: it stands still while the job waits in failover, and a Running job counts
on from what its earlier attempts ran, not from its first start."""

from __future__ import annotations

import pytest

from harness.browser import login
from harness.processes import wait

pytestmark = pytest.mark.slow

OWNER = ("runtime-owner", "owner-pass-1")

# Attempt 1 ran 7 minutes and ended 20 minutes ago; the job then waited (Pending) or, for a
# Running one, its attempt 2 started 1 minute ago. Nodes are cordoned so nothing places it.
JOB = """
import json
from datetime import timedelta
from django.contrib.auth.models import User
from django.utils import timezone
from jobs.models import Image, JobAttempt, Node, TrainingJob
from jobs.services.creation import personal_project_for
Node.objects.update(cordoned=True)
owner = User.objects.get(username={owner!r})
now = timezone.now()
job = TrainingJob.objects.create(
    owner=owner, project=personal_project_for(owner), name={name!r}, image=Image.objects.get(is_default=True).reference,
    command="python train.py", status={status!r}, started_at=now - timedelta(minutes=27), failover_count=1,
)
JobAttempt.objects.create(job=job, number=1, state="exited", exit_code=1, started_at=now - timedelta(minutes=27), ended_at=now - timedelta(minutes=20))
if {status!r} == "Running":
    JobAttempt.objects.create(job=job, number=2, state="running", started_at=now - timedelta(minutes=1))
print(json.dumps(job.pk))
"""


def running_times(page) -> list[str]:
    return page.locator("[data-field='running_time']").all_inner_texts()


# Afterwards the jobs are final before the nodes take work again: nothing runs them.
DONE = """
from django.utils import timezone
from jobs.models import JobAttempt, Node, TrainingJob
jobs = TrainingJob.objects.filter(name__startswith="runtime-")
JobAttempt.objects.filter(job__in=jobs, ended_at__isnull=True).update(state="exited", ended_at=timezone.now())
jobs.update(status="Stopped", finished_at=timezone.now())
Node.objects.update(cordoned=False)
"""


@pytest.fixture
def cordoned(users):
    yield users
    users.shell(DONE)


def test_a_job_waiting_in_failover_shows_a_running_time_that_stands_still(cordoned, page):
    console = cordoned
    job_id = console.shell_json(JOB.format(owner=OWNER[0], name="runtime-failover", status="Pending - failoverinprogress"))
    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/training-jobs/{job_id}/")
    page.wait_for_selector(".live-state--on")
    assert running_times(page) == ["7m 00s", "7m 00s"]  # not 27 minutes since it first started
    page.wait_for_timeout(2_200)  # two ticks of the page's one-second clock
    assert running_times(page) == ["7m 00s", "7m 00s"]

    page.goto(f"{console.base_url}/")
    page.wait_for_selector(".live-state--on")
    cell = page.locator(f"tr[data-job-id='{job_id}'] [data-field='running_time']")
    page.wait_for_timeout(1_200)
    assert cell.inner_text() == "7m 00s"
    assert page.js_errors == []


def test_a_running_job_counts_on_from_what_its_attempts_ran(cordoned, page):
    console = cordoned
    job_id = console.shell_json(JOB.format(owner=OWNER[0], name="runtime-running", status="Running"))
    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/")
    page.wait_for_selector(".live-state--on")
    cell = page.locator(f"tr[data-job-id='{job_id}'] [data-field='running_time']")
    # 7 minutes of attempt 1 and the minute attempt 2 has run so far: 8m, counting up.
    first = wait(lambda: cell.inner_text() if cell.inner_text().startswith("8m ") else None, "8m and some seconds", timeout=5)
    wait(lambda: cell.inner_text() != first, "the running time to count on", timeout=5)
    assert cell.inner_text().startswith("8m ")
    assert page.js_errors == []
