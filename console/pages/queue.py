"""The Queue page: waiting jobs by project with their reasons and start estimates, each project's
usage against its quota, and "why is this job not running". Staff see every project and may ask
about any job; a user sees their own projects and asks about the jobs they may see. Read-only."""

from __future__ import annotations

from dataclasses import dataclass, field

from django import forms
from django.contrib.auth.decorators import login_required
from django.db.models import F, Q, Window
from django.db.models.functions import RowNumber
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from console.estimate import estimate, estimates_for
from jobs.models import GPU, Project, TrainingJob
from jobs.services.quotas import ProjectUsage, project_usage, why_not_running
from jobs.statuses import JobStatus

# Waiting jobs listed per project (its head of line); the count says how many more wait.
SHOWN_PER_PROJECT = 25
QUEUED = [JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF, JobStatus.FAILOVER_IN_PROGRESS]


class WhyForm(forms.Form):
    job = forms.IntegerField(label="Job id", min_value=1, max_value=2**62)


@dataclass
class ProjectLine:
    usage: ProjectUsage
    jobs: list[TrainingJob] = field(default_factory=list)


def queue_overview(user) -> list[ProjectLine]:
    """Projects (the user's own, or every one for staff) with a quota, GPUs held or jobs waiting,
    each with its first waiting jobs and their start estimates."""
    busy = GPU.objects.filter(allocated_to__isnull=False).values("allocated_to__attempt__job__project")
    waiting = TrainingJob.objects.filter(status__in=QUEUED)
    projects = Project.objects.for_user(user).filter(Q(gpu_quota__gt=0) | Q(pk__in=busy) | Q(pk__in=waiting.values("project"))).order_by("name")
    lines = {u.project.pk: ProjectLine(u) for u in project_usage(projects)}
    head = Window(RowNumber(), partition_by=[F("project_id")], order_by=[F("priority").desc(), F("created_at").asc(), F("id").asc()])
    jobs = (
        waiting.filter(project__in=list(lines))
        .select_related("owner")
        .annotate(line_no=head)
        .filter(line_no__lte=SHOWN_PER_PROJECT)
        .order_by("project_id", "line_no")
    )
    listed: list = list(jobs)  # each gains its start estimate (the page's)
    estimates = estimates_for(listed)
    for job in listed:
        job.estimate = estimates.get(job.pk)
        lines[job.project_id].jobs.append(job)
    return list(lines.values())


@login_required
@require_GET
def queue_page(request: HttpRequest) -> HttpResponse:
    why_form = WhyForm(request.GET or None)
    answer = None
    if why_form.is_valid():
        job = TrainingJob.objects.visible_to(request.user).filter(pk=why_form.cleaned_data["job"]).select_related("project").first()
        if job is None:
            answer = (None, f"There is no job {why_form.cleaned_data['job']} you may see.")
        else:
            found = estimate(job)
            answer = (job, why_not_running(job) + (f" {found.text}" if found is not None else ""))
    return render(
        request,
        "queue/queue.html",
        {"lines": queue_overview(request.user), "why_form": why_form, "answer": answer, "shown": SHOWN_PER_PROJECT, "nav": "queue"},
    )
