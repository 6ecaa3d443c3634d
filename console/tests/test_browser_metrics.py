"""The Details tab charts a running job's GPU and host usage: points appear and grow without a
reload on simulated GPUs; the loss chart switches to a log scale."""
from __future__ import annotations

import pytest

from console.tests.browser import login, save_screenshot, wait

pytestmark = pytest.mark.slow

OWNER = ("metrics-owner", "owner-pass-1")
TRAINING = "python -m jobs.examples.train_ckpt --steps 2000 --save-every 50 --sleep 0.01"


def test_the_gpu_metrics_chart_shows_points_for_a_running_job(users, page):
    console = users
    job = console.create_job(OWNER[0], "metrics-run", TRAINING, gpus_per_node=2)
    try:
        console.wait_for_job(job["id"], "Running", timeout=60)
        login(page, console, *OWNER)
        page.goto(f"{console.base_url}/training-jobs/{job['id']}/")
        figure = page.locator("[data-metrics-chart]")
        wait(lambda: int(figure.get_attribute("data-point-count") or 0) >= 3, "three GPU samples on the chart", timeout=30)
        first = int(figure.get_attribute("data-point-count"))
        wait(lambda: int(figure.get_attribute("data-point-count")) > first, "the chart to grow live", timeout=20)
        assert figure.locator("canvas").count() >= 1
        assert "GPU util %" in figure.inner_text()
        status, samples = console.api("GET", f"/api/v1/training-jobs/{job['id']}/metrics/", user=OWNER[0])
        assert status == 200 and samples and all(0 <= s["gpu_util"] <= 100 for s in samples)

        loss = page.locator("[data-loss-chart]")
        wait(lambda: loss.get_attribute("data-point-count") is not None, "the loss curve", timeout=20)
        page.locator("[data-loss-log]").check()
        assert loss.get_attribute("data-scale") == "log"
        save_screenshot(page, "metrics-chart", full_page=True)
        assert page.js_errors == []
    finally:
        console.api("POST", f"/api/v1/training-jobs/{job['id']}/stop/", user=OWNER[0])
