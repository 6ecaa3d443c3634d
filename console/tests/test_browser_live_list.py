"""An open job list follows the jobs without a reload: a job created elsewhere appears (even on an
empty list), a deleted one leaves, and a filtered list gains a job when it enters the filter."""

from __future__ import annotations

import pytest

from harness.browser import login
from harness.processes import wait

pytestmark = pytest.mark.slow

OWNER = ("list-live-owner", "owner-pass-1")
WATCH_RELOAD = "() => { window.__noReload = 'same page'; }"


def row_ids(page) -> list[int]:
    return [int(x) for x in page.eval_on_selector_all("tr[data-job-id]", "rows => rows.map(r => r.dataset.jobId)")]


def test_an_empty_open_list_gains_a_job_created_elsewhere_and_loses_it_when_deleted(users, page):
    console = users
    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/")
    assert page.locator("text=You have no Training Jobs yet").is_visible()
    page.wait_for_selector(".live-state--on")
    page.evaluate(WATCH_RELOAD)

    job = console.create_job(OWNER[0], "made-elsewhere", "python -c \"print('hello')\"")
    page.locator(f"tr[data-job-id='{job['id']}']").wait_for(timeout=15_000)
    assert page.locator(f"tr[data-job-id='{job['id']}'] a.strong").inner_text() == "made-elsewhere"
    assert "1 job" in page.locator("[data-list-count]").inner_text()
    console.wait_for_job(job["id"], "Completed", timeout=90)
    page.locator(f"tr[data-job-id='{job['id']}'] .badge__text", has_text="Completed").wait_for(timeout=15_000)

    status, _ = console.api("DELETE", f"/api/v1/training-jobs/{job['id']}/", user=OWNER[0])
    assert status == 204
    wait(lambda: row_ids(page) == [], "the deleted job's row to leave the list", timeout=15)
    assert page.locator("text=You have no Training Jobs yet").is_visible()
    assert page.evaluate("window.__noReload") == "same page"
    assert page.js_errors == []


def test_a_list_filtered_to_finished_jobs_gains_a_job_when_it_finishes(users, page):
    console = users
    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/?group=finished")
    page.wait_for_selector(".live-state--on")
    page.evaluate(WATCH_RELOAD)
    before = row_ids(page)

    job = console.create_job(OWNER[0], "finishes-later", "python -c \"import time; time.sleep(2); print('done')\"")
    console.wait_for_job(job["id"], "Running", timeout=60)
    page.wait_for_timeout(1500)
    assert job["id"] not in row_ids(page), "a running job is not in a list of finished jobs"
    console.wait_for_job(job["id"], "Completed", timeout=90)
    wait(lambda: job["id"] in row_ids(page), "the finished job to join the filtered list", timeout=15)
    assert set(before) <= set(row_ids(page))
    assert page.evaluate("window.__noReload") == "same page"
    assert page.js_errors == []


def test_bulk_stop_names_the_selected_jobs_before_it_stops_them(users, page):
    console = users
    job = console.create_job(OWNER[0], "bulk-stop-me", 'python -c "import time; time.sleep(60)"')
    console.wait_for_job(job["id"], "Running", timeout=60)
    login(page, console, *OWNER)
    page.goto(f"{console.base_url}/")
    page.locator(f"#select-{job['id']}").check()
    page.get_by_role("button", name="Stop", exact=True).click()
    dialog = page.locator("[data-confirm-dialog]")
    assert dialog.is_visible()
    assert "Stop 1 job?" in dialog.inner_text() and "bulk-stop-me" in dialog.inner_text()
    dialog.locator("[data-confirm-yes]").click()
    page.wait_for_selector(".message--success:has-text('bulk-stop-me')")
    console.wait_for_job(job["id"], "Stopped", timeout=60)
    assert page.js_errors == []
