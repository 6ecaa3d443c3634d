"""Compare: two or more jobs' curves of one metric (loss, eval_loss, any number the Trainer logged)
on one chart, by step. The jobs are picked by id (``?jobs=3,7``, from the list's Compare button or
the page's own picker); a job the user may not see is named as such and left out, never shown."""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from jobs.models import TrainingJob
from logs.progress import chart_points, metric_names

MAX_JOBS = 8
PICKABLE = 40  # the user's newest jobs offered in the picker
METRIC = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]{0,63}$")


def asked_ids(request: HttpRequest) -> tuple[list[int], list[str]]:
    """The job ids asked for (``jobs=3,7`` or ``jobs=3&jobs=7``), in order, and what could not be read."""
    ids: list[int] = []
    unreadable: list[str] = []
    for raw in request.GET.getlist("jobs"):
        for part in filter(None, (p.strip() for p in raw.split(","))):
            if part.isdigit() and len(part) < 19:
                if int(part) not in ids:
                    ids.append(int(part))
            else:
                unreadable.append(part[:20])
    return ids, unreadable


def series_of(job: TrainingJob, points: list[dict[str, Any]], metric: str) -> list[list[float]]:
    """[step, value] pairs of ``metric`` in the job's points."""
    found = []
    for point in points:
        value = point["loss"] if metric == "loss" else (point.get("values") or {}).get(metric)
        if value is not None:
            found.append([point["step"], value])
    return found


@login_required
@require_GET
def compare(request: HttpRequest) -> HttpResponse:
    ids, unreadable = asked_ids(request)
    problems = [f"{text!r} is not a job id." for text in unreadable]
    if len(ids) > MAX_JOBS:
        problems.append(f"At most {MAX_JOBS} jobs are compared at once: the first {MAX_JOBS} are shown.")
        ids = ids[:MAX_JOBS]
    visible = TrainingJob.objects.visible_to(request.user)
    found = {job.pk: job for job in visible.filter(pk__in=ids)}
    problems += [f"There is no job {pk} you may see." for pk in ids if pk not in found]
    jobs = [found[pk] for pk in ids if pk in found]
    points = {job.pk: chart_points(job.pk) for job in jobs}
    metrics = sorted({name for job in jobs for name in metric_names(points[job.pk])}, key=lambda n: (n != "loss", n))
    asked = request.GET.get("metric", "")
    metric = asked if METRIC.match(asked) and asked in metrics else (metrics[0] if metrics else "loss")
    if asked and asked != metric:
        problems.append(f"No chosen job logged {asked[:64]!r}: showing {metric}.")
    series = []
    for job in jobs:
        pairs = series_of(job, points[job.pk], metric)
        series.append({"id": job.pk, "name": job.name, "points": pairs, "lowest": min((v for _, v in pairs), default=None)})
    pickable = visible.exclude(pk__in=[job.pk for job in jobs]).order_by("-created_at")[:PICKABLE]
    context = {
        "jobs": jobs,
        "series": series,
        "metric": metric,
        "metrics": metrics,
        "problems": problems,
        "pickable": pickable,
        "ids": ",".join(str(job.pk) for job in jobs),
        "nav": "jobs",
    }
    return render(request, "jobs/compare.html", context)
