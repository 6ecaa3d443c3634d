"""Every number the Trainer logged, in the pages: the Details tab's Metric choice, the Compare page
(two or more jobs' curves of one metric on one chart; a job the user may not see named and left
out), and the job list filtered by a metric's last value."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from django.urls import reverse

from logs.models import MetricPoint

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def curve(job, *points: tuple[int, float | None, dict]) -> None:
    for step, loss, values in points:
        MetricPoint.objects.create(job=job, step=step, loss=loss, values=values, ts=T0)


@pytest.fixture
def two_runs(make_job):
    lr_high = make_job(name="lr-high")
    curve(lr_high, (10, 3.0, {"grad_norm": 1.5}), (20, 2.5, {"eval_loss": 2.8}), (30, 2.2, {}), (40, 2.0, {"eval_loss": 2.4}))
    lr_low = make_job(name="lr-low")
    curve(lr_low, (10, 3.2, {}), (20, 2.9, {"eval_loss": 3.1}), (40, 2.6, {"eval_loss": 1.9}))
    no_metrics = make_job(name="no-metrics")
    return lr_high, lr_low, no_metrics


def series(html: str) -> list[dict]:
    return json.loads(re.search(r'<script id="compare-series" type="application/json">(.*?)</script>', html, re.S).group(1))


def test_details_offers_each_metric_the_job_logged(login, owner, two_runs):
    html = login(owner).get(reverse("jobs:detail", args=[two_runs[0].pk])).content.decode()
    assert re.findall(r'<option value="([^"]+)">', html.split("data-loss-metric", 1)[1].split("</select>", 1)[0]) == ["loss", "eval_loss", "grad_norm"]
    assert f'href="/compare/?jobs={two_runs[0].pk}"' in html


def test_compare_draws_each_jobs_curve_of_one_metric(login, owner, outsider, two_runs, make_job):
    lr_high, lr_low, _ = two_runs
    theirs = make_job(owner=outsider, name="theirs")
    curve(theirs, (10, 9.9, {"eval_loss": 9.9}))
    html = login(owner).get(reverse("compare"), {"jobs": f"{lr_high.pk},{lr_low.pk},{theirs.pk},abc", "metric": "eval_loss"}).content.decode()
    assert [(s["name"], s["points"]) for s in series(html)] == [("lr-high", [[20, 2.8], [40, 2.4]]), ("lr-low", [[20, 3.1], [40, 1.9]])]
    assert (
        f"There is no job {theirs.pk} you may see." in html and "&#x27;abc&#x27; is not a job id." in html and "theirs" not in html.split("Jobs</legend>", 1)[1]
    )
    assert '<option value="eval_loss" selected>' in html and "Lowest eval_loss" in html
    loss = series(login(owner).get(reverse("compare"), {"jobs": [lr_high.pk, lr_low.pk]}).content.decode())
    assert [len(s["points"]) for s in loss] == [4, 3]
    unknown = login(owner).get(reverse("compare"), {"jobs": f"{lr_high.pk}", "metric": "bleu"}).content.decode()
    assert "No chosen job logged &#x27;bleu&#x27;: showing loss." in unknown


@pytest.mark.database  # a JSON key's value compared: the database's own
def test_the_list_is_filtered_by_a_metrics_last_value(login, owner, two_runs):
    def listed(**query) -> set[str]:
        html = login(owner).get(reverse("jobs:list"), query).content.decode()
        return set(re.findall(r'data-field="name" data-label="Name"><a class="strong" href="/training-jobs/\d+/">([^<]+)</a>', html))

    assert listed(metric="eval_loss", below="2.0") == {"lr-low"}
    assert listed(metric="eval_loss", above="2.0") == {"lr-high"}
    assert listed(metric="loss", below="2.3") == {"lr-high"}
    assert listed(metric="eval_loss", below="5", above="2.5") == set()
    assert listed(metric="no such", below="1") == {"lr-high", "lr-low", "no-metrics"}  # an invalid name is ignored
