"""The Details tab charts a running job's GPU and host usage: points appear and grow without a
reload on simulated GPUs; the loss chart switches to a log scale; a short job's time axis stays
within its run, and the line breaks where the job waited between attempts."""

from __future__ import annotations

import json
import re

import pytest

from harness.browser import login, save_screenshot
from harness.processes import wait

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


# A job that ran, with its attempts and samples written as the platform would (no run needed):
# ``attempts`` are (start, end) offsets in seconds from an hour ago, ``samples`` (attempt, offset).
FINISHED_JOB = """
import json
from datetime import timedelta
from django.contrib.auth.models import User
from django.utils import timezone
from jobs.models import Image, JobAttempt, ResourceSample, TrainingJob
from jobs.services.creation import personal_project_for
owner = User.objects.get(username={owner!r})
t0 = timezone.now().replace(microsecond=0) - timedelta(hours=1)
at = lambda s: t0 + timedelta(seconds=s)
attempts, samples = {attempts!r}, {samples!r}
job = TrainingJob.objects.create(
    owner=owner, project=personal_project_for(owner), name={name!r}, image=Image.objects.get(is_default=True).reference,
    command="python train.py", status="Completed", started_at=at(attempts[0][0]), finished_at=at(attempts[-1][1]),
    failover_count=len(attempts) - 1,
)
for number, (start, end) in enumerate(attempts, 1):
    JobAttempt.objects.create(job=job, number=number, state="exited", exit_code=0, started_at=at(start), ended_at=at(end))
ResourceSample.objects.bulk_create(
    ResourceSample(job=job, attempt=a, ts=at(s), span_s=5.0, gpu_util=90.0, gpu_mem_mb=2048.0, power_w=250.0, cpu_percent=100.0, host_mem_mb=900.0)
    for a, s in samples
)
print(json.dumps({{"id": job.pk, "start": at(attempts[0][0]).timestamp(), "end": at(attempts[-1][1]).timestamp()}}))
"""

# The chart as the page drew it: the x scale, the time axis' ticks (seconds) and their labels, its data.
CHART = """() => {
  const chart = document.querySelector("[data-metrics-chart]").metricsChart;
  const axis = chart.axes[0];
  return {min: chart.scales.x.min, max: chart.scales.x.max, ticks: axis._splits || [], labels: (axis._values || []).map(String), data: chart.data};
}"""


def finished_job(console, name: str, attempts: list[tuple[int, int]], samples: list[tuple[int, int]]) -> dict:
    return console.shell_json(FINISHED_JOB.format(owner=OWNER[0], name=name, attempts=attempts, samples=samples))


def drawn_chart(page, console, job: dict) -> dict:
    page.goto(f"{console.base_url}/training-jobs/{job['id']}/")
    page.locator("[data-metrics-chart] canvas").first.wait_for()
    return page.evaluate(CHART)


def test_a_six_second_jobs_time_axis_spans_its_run_not_years(users, page):
    console = users
    job = finished_job(console, "metrics-six-seconds", attempts=[(0, 6)], samples=[(1, 5)])
    login(page, console, *OWNER)
    chart = drawn_chart(page, console, job)
    # Within a minute of the run on either side: not "Feb 2027 … Aug 2029".
    assert job["start"] - 60 <= chart["min"] < chart["max"] <= job["end"] + 60, (chart["min"], chart["max"], job)
    assert chart["ticks"] and all(job["start"] - 60 <= t <= job["end"] + 60 for t in chart["ticks"])
    # The labels read as seconds and times of the job's day (":35", "12/3/26 1:03pm"), not months or years.
    labels = chart["labels"]
    assert labels and all(re.fullmatch(r":\d{2}|\d{1,2}:\d{2}(:\d{2})?(am|pm)?", label.split("\n")[0]) for label in labels), labels
    day = page.evaluate(
        "(s) => { const d = new Date(s * 1000); return (d.getMonth() + 1) + '/' + d.getDate() + '/' + String(d.getFullYear()).slice(2); }", job["start"]
    )
    assert set(re.findall(r"\d{1,2}/\d{1,2}/\d{2}", " ".join(labels))) == {day}, labels
    assert page.js_errors == []


def test_the_usage_line_breaks_where_the_job_waited_between_attempts(users, page):
    console = users
    # Attempt 1 sampled every 5 s for a minute, 4.5 minutes of Pending, attempt 2 sampled for a minute.
    first = [(1, s) for s in range(5, 61, 5)]
    second = [(2, s) for s in range(335, 391, 5)]
    job = finished_job(console, "metrics-with-a-gap", attempts=[(0, 60), (330, 390)], samples=first + second)
    login(page, console, *OWNER)
    chart = drawn_chart(page, console, job)
    xs, util = chart["data"][0], chart["data"][1]
    gaps = [i for i, value in enumerate(util) if value is None]
    assert len(gaps) == 1, json.dumps(util)
    gap = gaps[0]
    # The one null lies between attempt 1's last sample and attempt 2's first: the line breaks there.
    assert xs[gap - 1] == job["start"] + 60 and xs[gap + 1] == job["start"] + 335
    assert xs[gap - 1] < xs[gap] < xs[gap + 1]
    assert len(xs) == len(first) + len(second) + 1
    assert page.locator("[data-metrics-chart]").get_attribute("data-point-count") == str(len(first) + len(second))
    assert page.js_errors == []
