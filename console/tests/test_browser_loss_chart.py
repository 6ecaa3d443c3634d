"""The loss chart on the Details tab: every logged loss against the step, with the epoch the log
told on a second axis, and the committed checkpoints marked and said in words under it."""

from __future__ import annotations

import pytest

from harness.browser import login, save_screenshot
from harness.processes import wait

pytestmark = [pytest.mark.slow, pytest.mark.backend_neutral]

OWNER = ("loss-chart-owner", "owner-pass-1")
# 40 steps over two epochs, as a Trainer-like loop logs them.
EPOCHS = "python -c \"for s in range(1, 41): print(f'epoch {s / 20:.2f} step {s}/40 loss {1 / s:.4f}')\""
CHECKPOINTS = "python -m jobs.examples.train_ckpt --steps 60 --save-every 20 --sleep 0"


def completed_job(console, page, name: str, command: str) -> int:
    """A job of OWNER run to its end, and the page signed in as its owner."""
    job = console.create_job(OWNER[0], name, command)
    assert console.wait_for_job(job["id"], {"Completed", "Failed", "Pending - internalerror"}, timeout=180)["status"] == "Completed"
    login(page, console, *OWNER)
    return job["id"]


def loss_chart(console, page, job_id: int, last_step: int):
    """The drawn chart, up to its last step (a fast run's batch keeps at most 50 of its losses:
    logs.progress.SAMPLES_PER_BATCH, the last one always)."""
    page.goto(f"{console.base_url}/training-jobs/{job_id}/")
    chart = page.locator("[data-loss-chart]")
    wait(lambda: chart.get_attribute("data-last-step") == str(last_step), f"the chart up to step {last_step}", timeout=30)
    return chart


def test_the_loss_chart_has_an_epoch_axis_where_the_log_tells_the_epoch(users, page):
    chart = loss_chart(users, page, completed_job(users, page, "loss-epochs", EPOCHS), 40)

    assert chart.get_attribute("data-epoch-axis") == "shown"
    assert float(chart.get_attribute("data-last-epoch")) == pytest.approx(2.0)
    ticks = [float(t) for t in chart.get_attribute("data-epoch-ticks").split()]
    assert len(ticks) >= 2 and ticks == sorted(ticks) and ticks[0] > 0 and ticks[-1] <= 2.0, ticks
    save_screenshot(page, "loss-chart-epochs", full_page=True)
    assert page.js_errors == []


def test_a_run_without_epochs_has_no_epoch_axis_and_its_checkpoints_are_marked(users, page):
    job_id = completed_job(users, page, "loss-checkpoints", CHECKPOINTS)
    page.goto(f"{users.base_url}/training-jobs/{job_id}/?tab=checkpoints")
    committed = sorted(int(step) for step in page.locator("[data-checkpoint-rows] tr[data-step]").evaluate_all("rows => rows.map(r => r.dataset.step)"))
    assert committed == [20, 40, 60], committed
    chart = loss_chart(users, page, job_id, 60)

    assert chart.get_attribute("data-epoch-axis") == "none"
    assert chart.get_attribute("data-checkpoint-markers") == "3"
    assert chart.locator("[data-loss-legend]").inner_text() == "Green dotted: 3 committed checkpoints."
    save_screenshot(page, "loss-chart-checkpoints", full_page=True)
    assert page.js_errors == []
