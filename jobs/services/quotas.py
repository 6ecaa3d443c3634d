"""What a project uses against its quota, and why a job is not running: read-only views of the
fair-share queue for the list page, the API and the operators' Queue page."""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.db.models import Count, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce

from jobs.fairshare import ProjectShare
from jobs.models import GPU, JobAttempt, Project, TrainingJob
from jobs.statuses import ON_NODE, TERMINAL, WAITING, JobStatus

# The list page's usage line counts a project's waiting jobs up to this ("more than 1,000 jobs
# waiting"): an exact count reads every one of them (20,000 waiting: 7-12 ms a page).
WAITING_CAP = 1_000


@dataclass(frozen=True)
class ProjectUsage:
    project: Project
    used_gpus: int
    waiting_jobs: int
    cpu_jobs: int | None  # None: not counted (the list page's line does not show it)
    # Where set, ``waiting_jobs`` is exact up to it and one past it means "more".
    waiting_cap: int | None = None

    @property
    def quota(self) -> int:
        return self.project.gpu_quota

    @property
    def borrowed(self) -> int:
        return max(0, self.used_gpus - self.quota)

    @property
    def cpu_job_limit(self) -> int:
        limit = self.project.cpu_job_limit
        return settings.QUEUE_CPU_JOBS_PER_PROJECT if limit is None else limit

    @property
    def recent_gpus(self) -> float:
        """GPUs held on average lately (the decayed usage the queue orders by, as a GPU count)."""
        share = ProjectShare(quota=self.quota, usage=self.project.usage_gpu_seconds)
        return share.key(settings.QUEUE_USAGE_HALF_LIFE) * max(self.quota, 1)

    @property
    def text(self) -> str:
        """ "using 6 of 8 GPUs; 2 borrowed" (or "using 1 GPU, none guaranteed …" without a quota)
        — what members read on the list page."""
        limit = self.project.gpu_borrow_limit
        if self.quota == 0:
            # No guaranteed GPUs: whatever it uses is idle capacity it may lose to a project's quota.
            text = f"using {self.used_gpus} GPU{'s' if self.used_gpus != 1 else ''}, none guaranteed (no quota: idle GPUs are lent)"
            if limit is not None:
                text += f" (may borrow {limit})" if limit else " (no borrowing)"
            return text
        text = f"using {self.used_gpus} of {self.quota} GPU{'s' if self.quota != 1 else ''}"
        if self.borrowed:
            text += f"; {self.borrowed} borrowed"
        if limit is not None:
            text += f" (may borrow {limit})" if limit else " (no borrowing)"
        return text

    @property
    def waiting_text(self) -> str:
        """ "3 jobs waiting", or "more than 1,000 jobs waiting" past the cap."""
        if self.waiting_cap is not None and self.waiting_jobs > self.waiting_cap:
            return f"more than {self.waiting_cap:,} jobs waiting"
        return f"{self.waiting_jobs} job{'s' if self.waiting_jobs != 1 else ''} waiting"


class CountOf(Subquery):
    """The number of a subquery's rows, for ``annotate``: sliced, a count that stops there."""

    template = "(SELECT COUNT(*) FROM (%(subquery)s) counted)"
    output_field = IntegerField()


def count_of(queryset, project_field: str) -> Coalesce:
    """A correlated count per project, for ``annotate`` (no join that would multiply rows)."""
    per_project = queryset.filter(**{project_field: OuterRef("pk")}).order_by().values(project_field).annotate(n=Count("pk"))
    return Coalesce(Subquery(per_project.values("n")[:1]), 0)


def project_usage(projects: QuerySet[Project], *, waiting_cap: int | None = None, cpu_jobs: bool = True) -> list[ProjectUsage]:
    """Usage of each project, in two queries whatever the number of jobs. Waiting are jobs
    Pending (or in image back-off) with no placement yet; with ``waiting_cap``, counted up to one
    past it (``ProjectUsage.waiting_text``). ``cpu_jobs=False``: CPU-only jobs not counted.

    The GPUs held are counted from the fleet's held GPUs, grouped by project: a count correlated
    on the project made SQLite walk every job the project ever had (23 ms at 100,000 jobs)."""
    placed = JobAttempt.objects.filter(state=JobAttempt.State.PLACED).values("job_id")
    waiting = TrainingJob.objects.filter(status__in=[JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF]).exclude(pk__in=placed)
    waiting_count: Coalesce | CountOf
    if waiting_cap is None:
        waiting_count = count_of(waiting, "project")
    else:
        waiting_count = CountOf(waiting.filter(project=OuterRef("pk")).order_by().values("pk")[: waiting_cap + 1])
    counts: dict[str, Coalesce | CountOf] = {"waiting": waiting_count}
    if cpu_jobs:
        counts["cpu"] = count_of(TrainingJob.objects.filter(status__in=ON_NODE, gpus_per_node=0), "project")
    rows = list(projects.annotate(**counts))
    held: dict[int, int] = {}
    if rows:
        held = dict(
            GPU.objects.filter(allocated_to__isnull=False)
            .order_by()
            .values_list("allocated_to__attempt__job__project")
            .annotate(n=Count("pk"))
            .values_list("allocated_to__attempt__job__project", "n")
        )
    return [ProjectUsage(p, held.get(p.pk, 0), p.__dict__["waiting"], p.__dict__.get("cpu"), waiting_cap) for p in rows]


def why_not_running(job: TrainingJob) -> str:
    """One sentence for an operator (or the job's members): why this job does not run now."""
    if job.status in ON_NODE:
        return f"It is {job.status}."
    if job.status in TERMINAL:
        return f"It ended {job.status}: {job.status_reason or 'no reason recorded'}."
    if job.status == JobStatus.FAILOVER_IN_PROGRESS:
        return f"Job Failover is judging its last run or re-placing it: {job.status_reason or 'judging'}."
    if job.status == JobStatus.IMAGE_PULL_BACKOFF:
        return f"Its image cannot be resolved; retried with back-off: {job.status_reason}."
    open_attempt = JobAttempt.objects.filter(job=job, state__in=[JobAttempt.State.PLACED]).first()
    if open_attempt is not None:
        return f"It is placed (attempt {open_attempt.number}) and its node agent is starting it."
    if job.status in WAITING and job.status_reason and not job.status_reason.startswith("job created"):
        return f"It waits in the queue: {job.status_reason}."
    return "It waits in the queue; the next placement round will say where it stands."
