"""A job's detail page follows the job to its end without a reload: the loss chart reaches the last
step of a short run, the Attempts table fills, the Delete button comes and Stop goes, the flash
message tells the current status, and live times carry their zone like the server's."""

from __future__ import annotations

import pytest

from harness.browser import login
from harness.processes import wait

pytestmark = pytest.mark.slow

OWNER = ("detail-live-owner", "owner-pass-1")


def short_run(steps: int, pause: float) -> str:
    return f"python -c \"import time\nfor i in range(1, {steps} + 1):\n    print(f'step {{i}}/{steps} loss {{1.0 / i:.4f}}', flush=True); time.sleep({pause})\""


def test_the_detail_page_follows_a_short_run_to_its_last_point(users, page):
    console = users
    console.shell("from jobs.models import Node; Node.objects.update(cordoned=True)")
    try:
        login(page, console, *OWNER)
        page.goto(f"{console.base_url}/training-jobs/new/")
        page.fill("#id_name", "short-live-run")
        page.fill("#id_command", short_run(30, 0.05))
        page.click("button[type=submit]:has-text('Create Training Job')")
        page.wait_for_url("**/training-jobs/*/")
        page.wait_for_selector(".live-state--on")
        page.evaluate("() => { window.__noReload = 'same page'; }")
        assert page.locator(".message--success").inner_text().endswith("It is Pending.")
        assert "No attempts yet" in page.locator("[data-live-region='attempts']").inner_text()
        assert page.locator("[data-action='delete']").count() == 0
    finally:
        console.shell("from jobs.models import Node; Node.objects.update(cordoned=False)")

    page.locator(".job-header .badge__text", has_text="Completed").wait_for(timeout=90_000)
    figure = page.locator("[data-loss-chart]")
    wait(lambda: figure.get_attribute("data-last-step") == "30", "the chart's last point at step 30", timeout=15)
    assert int(figure.get_attribute("data-point-count")) == 30
    wait(lambda: page.locator("[data-live-region='attempts'] tr[data-attempt='1']").count() == 1, "attempt 1 in the table", timeout=10)
    assert "Succeeded" in page.locator("tr[data-attempt='1']").inner_text() or "code 0" in page.locator("tr[data-attempt='1']").inner_text()
    wait(lambda: page.locator("[data-action='delete']").count() == 1, "the Delete button", timeout=10)
    assert not page.locator("[data-action='stop']").is_visible()
    assert page.locator(".message--success").inner_text().endswith("It is Completed.")
    finished = page.locator("[data-field='finished_at'] time").inner_text()
    started = page.locator("[data-field='started_at'] time").inner_text()
    assert finished.endswith(" UTC") and started.endswith(" UTC"), (started, finished)
    assert page.evaluate("window.__noReload") == "same page"
    assert page.js_errors == []
