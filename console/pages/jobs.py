"""The console's Training Job pages: list (with bulk actions), create/clone, detail, stop and delete."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agent.backend import replicates
from agent.resume import commit_outside_storage, resumable_step
from console.api.outputs import folded, outputs_of
from console.estimate import estimate
from console.forms import GROUP_LABELS, JobListFilterForm, TrainingJobForm, statuses_of_group, visible_volumes_text
from console.live import MAX_SNAPSHOTS, server_now, visible_snapshots
from console.pages import run_dirs
from console.paging import COUNT_CAP, CappedPaginator, list_branches
from failover.classify import HARDWARE
from failover.services.health import attempt_events
from jobs.models import Image, Project, TrainingJob, TrainingJobQuerySet
from jobs.services.actions import JobActionRefused, delete_job, request_stop, resume_job
from jobs.services.creation import JobRefused, clone_name, create_job, personal_project_for
from jobs.services.limits import limits_of, unenforced_nodes
from jobs.services.paths import volumes_of
from jobs.services.samples import samples_of
from jobs.statuses import DELETABLE, RESUMABLE, STOPPABLE, TERMINAL, JobStatus
from logs.models import Checkpoint, JobProgress
from logs.progress import chart_points, metric_names
from logs.queries import failing_line, line_with_text, stream_tail

logger = logging.getLogger(__name__)

TABS = ("details", "logs", "checkpoints", "outputs", "failover", "events")
LOG_TAIL_LINES = 1000
# A bulk request names at most this many jobs (a page holds at most 100).
BULK_LIMIT = 500


def visible_jobs(request: HttpRequest) -> TrainingJobQuerySet:
    return TrainingJob.objects.visible_to(request.user).select_related("owner", "project")


def safe_next(request: HttpRequest, default: str) -> str:
    """The ``next`` the form carries (the list with its querystring), if it points to this site."""
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return target
    return default


def filtered_statuses(filters: JobListFilterForm) -> list[str]:
    """The statuses the list is filtered to ([]: any), for reading each one off its index."""
    status = filters.value("status") or ""
    if status.startswith("group:"):
        return sorted(statuses_of_group(status.removeprefix("group:")))
    return [status] if status else []


# What a row of the list shows (console_tags.job_list_row): read whole (its command, variables,
# decrypted secrets, its owner's and project's every column) a page of 100 jobs took 20 ms to load.
LIST_ROW_FIELDS = (
    *("name", "status", "status_reason", "job_type", "image", "gpus_per_node", "node_count", "failover_count"),
    *("created_at", "finished_at", "owner__username", "project__name"),
    *("progress__step", "progress__total", "progress__epoch", "progress__loss", "progress__lr"),
)


def list_rows(jobs: TrainingJobQuerySet) -> TrainingJobQuerySet:
    """A page's rows read with what they show: running times, owner, project and progress."""
    return jobs.with_run_time().select_related("owner", "project", "progress").only(*LIST_ROW_FIELDS)


@login_required
@require_GET
def job_list(request: HttpRequest) -> HttpResponse:
    filters = JobListFilterForm(request.GET)
    jobs = filters.apply(TrainingJob.objects.visible_to(request.user))
    branches = list_branches(request.user, filtered_statuses(filters))
    page = CappedPaginator(jobs, filters.per_page, branches=branches, rows=list_rows).get_page(request.GET.get("page"))
    return render(
        request,
        "jobs/job_list.html",
        {
            "filters": filters,
            "page": page,
            "jobs": page.object_list,
            "max_failovers": settings.MAX_FAILOVERS,
            "count_cap": COUNT_CAP,
            "group_labels": GROUP_LABELS,
            "nav": "jobs",
            "live": True,
        },
    )


def selected_ids(request: HttpRequest) -> list[int]:
    ids = []
    for raw in request.POST.getlist("job_ids")[:BULK_LIMIT]:
        try:
            ids.append(int(raw))
        except ValueError:
            continue
    return sorted(set(ids))


@login_required
@require_POST
def bulk_action(request: HttpRequest) -> HttpResponse:
    """Stop or delete the selected jobs, one service call each; refusals become messages.

    Deleting asks for confirmation first (a page listing the jobs), so it is safe with JavaScript off.
    """
    back = safe_next(request, reverse("jobs:list"))
    action = request.POST.get("action")
    ids = selected_ids(request)
    if action not in {"stop", "delete"}:
        messages.error(request, "Choose Stop or Delete.")
        return redirect(back)
    if not ids:
        messages.warning(request, "Select at least one job first.")
        return redirect(back)
    jobs = list(visible_jobs(request).filter(pk__in=ids).order_by("name"))
    if action == "delete" and request.POST.get("confirmed") != "yes":
        deletable = [job for job in jobs if job.status in DELETABLE]
        return render(
            request,
            "jobs/bulk_confirm_delete.html",
            {"jobs": jobs, "deletable": deletable, "missing": len(ids) - len(jobs), "next": back, "nav": "jobs"},
        )
    actor = request.user.get_username()
    done: list[str] = []
    for job in jobs:
        try:
            if action == "stop":
                request_stop(job, actor=actor)
            else:
                delete_job(job)
        except JobActionRefused as exc:
            messages.error(request, f"{job.name}: {exc}")
        else:
            done.append(job.name)
    if done:
        verb = "Stop requested for" if action == "stop" else "Deleted"
        messages.success(request, f"{verb} {len(done)} job{'s' if len(done) != 1 else ''}: {', '.join(done)}.")
    if missing := len(ids) - len(jobs):
        messages.error(request, f"{missing} selected job{'s were' if missing != 1 else ' was'} not found.")
    return redirect(back)


# A run of these ended in an error the user may fix: the detail page offers "Clone and fix".
FIXABLE = frozenset({JobStatus.FAILED, JobStatus.INTERNAL_ERROR, JobStatus.MAX_RETRIES_EXCEEDED})


def chart_markers(job: TrainingJob, attempts: list) -> dict[str, list[dict[str, Any]]]:
    """Where the charts mark a new attempt (failover, resume) and each committed checkpoint."""
    checkpoints = Checkpoint.objects.filter(job=job).order_by("committed_at").values_list("step", "committed_at")[:500]
    return {
        "attempts": [{"number": a.number, "started_at": a.started_at.isoformat() if a.started_at else None, "resume_step": a.resume_step} for a in attempts],
        "checkpoints": [{"step": step, "at": at.isoformat()} for step, at in checkpoints],
    }


def with_failing_lines(job: TrainingJob, attempts: list) -> list:
    """Each attempt that ended badly gets ``failing_line``: the log line that tells why (or None)."""
    for attempt in attempts:
        ended_badly = attempt.ended_at and (attempt.exit_code not in (0, None) or attempt.exit_signal or attempt.verdict)
        # A fault the node's own evidence told (an Xid, NVML): that evidence is the cause, shown
        # beside it; the run's last line (a progress bar, say) is not.
        evidence = attempt.evidence or {}
        if attempt.verdict == HARDWARE and evidence.get("source") == "log" and isinstance(evidence.get("matched"), str):
            # The run's own line told the fault (an ECC error, say): that line, not its last one.
            attempt.failing_line = line_with_text(job.pk, attempt=attempt.number, text=evidence["matched"])
        elif attempt.verdict == HARDWARE:
            attempt.failing_line = None  # the node's evidence told it, shown beside the cause
        else:
            attempt.failing_line = failing_line(job.pk, attempt=attempt.number) if ended_badly else None
    return attempts


def job_form_page(request: HttpRequest, *, initial: dict[str, Any], source: TrainingJob | None = None) -> HttpResponse:
    """The create form (blank or cloned from ``source``); a valid POST creates the job."""
    form = TrainingJobForm(
        request.POST or None,
        request.FILES or None,
        owner=request.user,
        initial=initial,
        kept_secrets=source.secret_env if source is not None and source.owner_id == request.user.pk else None,
    )
    if request.method == "POST" and form.is_valid():
        try:
            job = create_job(owner=request.user, actor=request.user.get_username(), **form.cleaned_job_fields())
        except IntegrityError:
            # Another request took the name between the form's check and the insert.
            form.name_taken()
        except JobRefused as exc:
            form.add_error(None, str(exc))
        else:
            # The status is marked so the detail page's live updates keep the message true.
            messages.success(request, format_html('Training Job {} created. It is <span data-field="status_text">{}</span>.', job.name, job.status))
            return redirect("jobs:detail", pk=job.pk)
    images = Image.objects.order_by("reference").values_list("reference", "description")
    context: dict[str, object] = {"form": form, "source": source, "images": images, "nav": "jobs", "volumes_text": visible_volumes_text(form.projects)}
    if source is not None and request.GET.get("fix") and source.status in FIXABLE:
        # "Clone and fix": quote the line the failed run ended on above the prefilled form.
        last = source.attempts.order_by("-number").first()
        context["fix_line"] = failing_line(source.pk, attempt=last.number) if last else None
    return render(request, "jobs/job_form.html", context)


@login_required
@require_http_methods(["GET", "POST"])
def job_create(request: HttpRequest) -> HttpResponse:
    return job_form_page(request, initial={"project": personal_project_for(request.user)})


@login_required
@require_http_methods(["GET", "POST"])
def job_clone(request: HttpRequest, pk: int) -> HttpResponse:
    source = get_object_or_404(visible_jobs(request), pk=pk)
    member = Project.objects.filter(pk=source.project_id, members__pk=request.user.pk or 0).exists()
    project = source.project if member else personal_project_for(request.user)
    initial = TrainingJobForm.initial_from(source, name=clone_name(source, request.user), project=project)
    if source.warm_start_job_id and not visible_jobs(request).filter(pk=source.warm_start_job_id).exists():
        initial["warm_start"] = ""  # a job the cloner may not see is not named to them
    return job_form_page(request, initial=initial, source=source)


def log_tab(job: TrainingJob, requested_stream: str | None) -> dict[str, Any]:
    """The last lines of one stream, oldest first, and the streams the job has."""
    tail = stream_tail(job.pk, requested_stream, LOG_TAIL_LINES)
    return {"streams": tail.streams, "stream": tail.stream, "log_lines": tail.lines, "log_truncated": tail.truncated, "log_tail": LOG_TAIL_LINES}


@login_required
@require_GET
def job_detail(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request).with_run_time(), pk=pk)
    tab = request.GET.get("tab") if request.GET.get("tab") in TABS else "details"
    context: dict[str, Any] = {
        "job": job,
        "tab": tab,
        "tabs": [(name, name.capitalize()) for name in TABS],
        "can_stop": job.status in STOPPABLE,
        "can_delete": job.status in DELETABLE,
        "can_fix": job.status in FIXABLE,
        # "Pending - …" statuses that are final: say so, they read like waiting.
        "final_pending": job.status in TERMINAL and job.status.startswith("Pending"),
        "resume_step": resumable_step(job) if job.status in RESUMABLE else None,
        "max_failovers": settings.MAX_FAILOVERS,
        "checkpointless_on": replicates(),
        "nav": "jobs",
    }
    context["progress"] = JobProgress.objects.filter(job=job).first()
    context["queue_estimate"] = estimate(job)
    # The paths the run sees; a node's host paths are for staff (console.pages.run_dirs).
    context["output_dir"] = run_dirs.output_dir(job)
    context["show_host_paths"] = request.user.is_staff
    context["volumes"] = volumes_of(job.project)
    # Checkpoints the run commits where a re-placed run cannot find them: said while it runs.
    context["checkpoints_lost"] = commit_outside_storage(job) if job.status == JobStatus.RUNNING else None
    context["storage_names"] = run_dirs.visible_storage_names(job, staff=request.user.is_staff)
    context["limits"] = limits_of(job)
    context["limits_unenforced"] = unenforced_nodes(job) if context["limits"].any else []
    if tab == "details":
        context["attempts"] = with_failing_lines(job, list(job.attempts.prefetch_related("placements__node").order_by("number")))
        context["chart_points"] = chart_points(job.pk)
        context["chart_metrics"] = metric_names(context["chart_points"])
        context["metrics_samples"] = samples_of(job.pk)
        context["sample_interval"] = settings.RESOURCE_SAMPLE_INTERVAL
        context["chart_markers"] = chart_markers(job, context["attempts"])
    elif tab == "logs":
        context.update(log_tab(job, request.GET.get("stream")))
    elif tab == "checkpoints":
        context.update(checkpoints_tab(job))
    elif tab == "outputs":
        context["outputs"] = outputs_of(job)
        for tree in context["outputs"]["trees"].values():
            tree["rows"] = folded(tree["entries"])
    elif tab == "failover":
        context["timeline"] = failover_timeline(job)
    else:
        context["events"] = job.events.order_by("created_at", "id")
    return render(request, "jobs/job_detail.html", context)


CHECKPOINT_ROWS = 500


def checkpoints_tab(job: TrainingJob) -> dict[str, Any]:
    """The newest committed checkpoints first, and the last one (the work at risk is counted from it)."""
    # Rows gain download_url (the page's): a plain list.
    rows: list = list(Checkpoint.objects.filter(job=job).order_by("-committed_at", "-id")[: CHECKPOINT_ROWS + 1])
    available = {row["step"] for row in outputs_of(job, trees=False)["checkpoints"] if row["available"]}
    for row in rows:
        row.download_url = reverse("training-job-download", args=[job.pk, f"checkpoint-{row.step}"]) if row.step in available else ""
    return {
        "checkpoints": rows[:CHECKPOINT_ROWS],
        "checkpoints_truncated": len(rows) > CHECKPOINT_ROWS,
        "last_checkpoint": rows[0] if rows else None,
    }


def failover_timeline(job: TrainingJob) -> list[dict[str, Any]]:
    """Each attempt with where it ran, how it ended, the verdict and evidence, and its events."""
    attempts = with_failing_lines(job, list(job.attempts.prefetch_related("placements__node").order_by("number")))
    events: dict[int | None, list] = {}
    for event in job.events.order_by("created_at", "id"):
        events.setdefault(event.attempt, []).append(event)
    resumed_in = resume_dirs(job, attempts)
    return [
        {"attempt": attempt, "events": events.get(attempt.number, []), "health": attempt_events(attempt), "resume_dir": resumed_in.get(attempt.number, "")}
        for attempt in attempts
    ]


def resume_dirs(job: TrainingJob, attempts: list) -> dict[int, str]:
    """Where each resumed attempt's checkpoint step was committed, as the run named it: the
    directory of the newest earlier commit line of that step."""
    steps = {a.resume_step for a in attempts if a.resume_step is not None}
    if not steps:
        return {}
    rows = list(Checkpoint.objects.filter(job=job, step__in=steps).order_by("committed_at", "id").values_list("attempt", "step", "path")[:1000])
    found: dict[int, str] = {}
    for attempt in attempts:
        paths = [path for number, step, path in rows if number < attempt.number and step == attempt.resume_step and path]
        if paths:
            found[attempt.number] = paths[-1].rpartition("/")[0]
    return found


@login_required
@require_GET
def job_live(request: HttpRequest) -> HttpResponse:
    """Catch-up snapshots of the jobs a live page shows (``?ids=1,2,3``), after its socket (re)connects."""
    ids: list[int] = []
    for raw in request.GET.get("ids", "").split(",")[:MAX_SNAPSHOTS]:
        raw = raw.strip()
        if raw.isdigit() and len(raw) <= 18:
            ids.append(int(raw))
    return JsonResponse({"now": server_now(), "jobs": visible_snapshots(request.user, ids)})


@login_required
@require_POST
def job_stop(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(visible_jobs(request), pk=pk)
    try:
        new_status = request_stop(job, actor=request.user.get_username())
    except JobActionRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, format_html('{} is <span data-field="status_text">{}</span>.', job.name, new_status))
    return redirect(safe_next(request, reverse("jobs:detail", args=[job.pk])))


@login_required
@require_POST
def job_resume(request: HttpRequest, pk: int) -> HttpResponse:
    """Resume a Stopped / internalerror job from its last committed checkpoint (a new attempt)."""
    job = get_object_or_404(visible_jobs(request), pk=pk)
    step = resumable_step(job)
    try:
        resume_job(job, actor=request.user.get_username(), checkpoint_step=step)
    except JobActionRefused as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, format_html('{} resumes from checkpoint step {}. It is <span data-field="status_text">Pending</span>.', job.name, step))
    return redirect("jobs:detail", pk=job.pk)


@login_required
@require_http_methods(["GET", "POST"])
def job_delete(request: HttpRequest, pk: int) -> HttpResponse:
    """GET asks for confirmation; POST deletes a finished job."""
    job = get_object_or_404(visible_jobs(request), pk=pk)
    if request.method == "GET":
        return render(request, "jobs/job_confirm_delete.html", {"job": job, "can_delete": job.status in DELETABLE, "nav": "jobs"})
    try:
        delete_job(job)
    except JobActionRefused as exc:
        messages.error(request, str(exc))
        return redirect("jobs:detail", pk=job.pk)
    messages.success(request, f"Training Job {job.name} deleted.")
    return redirect("jobs:list")
