"""When a waiting job may start: its place in line and an estimate from what holds the GPUs now.

Each running job's end is estimated from its progress (steps left at the rate its current
attempt has gone so far: the log's ``step/total``) or else from its maximum run time; a job with
neither holds its GPUs for an unknown time. Then the GPUs are replayed node by node: at each
estimated end, the jobs ahead of this one in its line (its place, which the fair-share queue
gives per shape, each needing the same shape) take what they fit first, then this one. The
answer is an estimate and says so; it ignores jobs that arrive later with a higher claim (a
project under its quota, a higher priority) and Spot jobs that would yield.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Q
from django.utils import timezone

from jobs.models import GPU, JobAttempt, Node, TrainingJob
from jobs.statuses import WAITING, JobStatus
from logs.models import JobProgress

PLACE = re.compile(r"^(\d+)(?:st|nd|rd|th) for ")
BEHIND = re.compile(r"^behind (\d+)\+ jobs for ")


@dataclass(frozen=True)
class Estimate:
    place: int | None  # 1: first of its shape; None: not known yet
    seconds: float | None  # from now until it may start; None: no estimate
    text: str

    def as_dict(self) -> dict:
        return {"place": self.place, "seconds": None if self.seconds is None else round(self.seconds), "text": self.text}


@dataclass(frozen=True)
class Holding:
    node_id: int
    gpus: int
    ends_in: float | None  # seconds; None: unknown


def place_of(job: TrainingJob) -> int | None:
    """The job's place in its line, as the last placement round said it in its reason."""
    reason = job.status_reason or ""
    if match := PLACE.match(reason):
        return int(match.group(1))
    if match := BEHIND.match(reason):
        return int(match.group(1)) + 1
    return None


def remaining_seconds(attempt: JobAttempt, progress: JobProgress | None, job: TrainingJob, now: datetime) -> float | None:
    """How long a running attempt may still hold its GPUs, or None where nothing tells."""
    if attempt.started_at is None:
        return None
    ran = max((now - attempt.started_at).total_seconds(), 1.0)
    estimates = []
    if progress is not None and progress.step and progress.total and progress.total > progress.step:
        done = progress.step - (attempt.resume_step or 0)
        if done > 0:
            estimates.append((progress.total - progress.step) * ran / done)
    if job.max_run_minutes:
        running = job.running_time
        so_far = running.total_seconds() if running is not None else ran
        estimates.append(max(job.max_run_minutes * 60 - so_far, 0.0))
    return min(estimates) if estimates else None


def holdings(now: datetime) -> tuple[list[Holding], dict[int, int]]:
    """Who holds which node's GPUs until when, and each usable node's free GPUs now."""
    held = (
        GPU.objects.filter(allocated_to__isnull=False)
        .values("node_id", "allocated_to__attempt_id")
        .annotate(n=Count("pk"))
        .values_list("node_id", "allocated_to__attempt_id", "n")
    )
    attempt_ids = {attempt for _, attempt, _ in held}
    attempts = {a.pk: a for a in JobAttempt.objects.filter(pk__in=attempt_ids)}
    job_ids = {a.job_id for a in attempts.values()}
    jobs = {j.pk: j for j in TrainingJob.objects.filter(pk__in=job_ids).with_run_time()}
    progress = {p.job_id: p for p in JobProgress.objects.filter(job_id__in=job_ids)}
    found = []
    for node_id, attempt_id, count in held:
        attempt = attempts.get(attempt_id)
        job = jobs.get(attempt.job_id) if attempt is not None else None
        ends = remaining_seconds(attempt, progress.get(job.pk), job, now) if attempt is not None and job is not None else None
        found.append(Holding(node_id, count, ends))
    usable = Node.objects.filter(state=Node.State.READY, healthy=True, cordoned=False)
    free = dict(usable.annotate(n=Count("gpus", filter=Q(gpus__healthy=True, gpus__allocated_to__isnull=True))).values_list("pk", "n"))
    return found, free


def fits(free: dict[int, int], per_node: int, nodes: int) -> list[int] | None:
    """The nodes a shape takes (the emptiest first), or None where it does not fit now."""
    able = sorted((node for node, n in free.items() if n >= per_node), key=lambda node: -free[node])
    return able[:nodes] if len(able) >= nodes else None


def say(seconds: float) -> str:
    if seconds < 90:
        return "within about a minute"
    if seconds < 90 * 60:
        return f"in about {round(seconds / 60)} minutes"
    return f"in about {seconds / 3600:.1f} hours"


def estimate(job: TrainingJob, *, now: datetime | None = None, state: tuple[list[Holding], dict[int, int]] | None = None) -> Estimate | None:
    """The waiting job's place and start estimate (None for a job that is not waiting).
    ``state``: ``holdings()`` shared by several jobs' estimates."""
    if job.status not in WAITING or job.status == JobStatus.FAILOVER_IN_PROGRESS:
        return None
    now = now or timezone.now()
    found, free_now = state if state is not None else holdings(now)
    place = place_of(job)
    per_node, nodes = max(job.gpus_per_node, 0), job.node_count
    if place is None:
        where = "its place in line not known yet"
    else:
        where = "first in line for its shape" if place == 1 else f"{place - 1} job{'s' if place != 2 else ''} of its shape ahead"
    if per_node == 0:
        return Estimate(place, None, f"A CPU job: it starts when its project's CPU-job limit allows ({where}).")
    free = dict(free_now)
    ahead = (place - 1) if place else 0
    ends = sorted((h for h in found if h.ends_in is not None), key=lambda h: h.ends_in or 0.0)
    unknown = sum(h.gpus for h in found if h.ends_in is None)
    moments = [0.0, *(h.ends_in or 0.0 for h in ends)]
    for index, moment in enumerate(moments):
        if index:
            released = ends[index - 1]
            if released.node_id in free:  # a cordoned or unhealthy node frees nothing placeable
                free[released.node_id] += released.gpus
        while ahead and (taken := fits(free, per_node, nodes)) is not None:
            for node in taken:
                free[node] -= per_node
            ahead -= 1
        if not ahead and fits(free, per_node, nodes) is not None:
            if moment == 0.0:
                return Estimate(place, 0.0, f"It fits now ({where}): the next placement round starts it.")
            return Estimate(place, moment, f"It may start {say(moment)} ({where}), as the running jobs' progress and run limits tell; an estimate.")
    if unknown:
        why = f"{unknown} GPU{'s are' if unknown != 1 else ' is'} held by jobs with no progress total or maximum run time"
    elif place and place > 1:
        why = "the jobs ahead of it take the GPUs as they free up, and how long they run is not known before they start"
    else:
        why = "the healthy nodes do not have the GPUs it needs"
    return Estimate(place, None, f"No estimate ({where}): {why}.")


def estimates_for(jobs: Sequence[TrainingJob]) -> dict[int, Estimate]:
    """Estimates for several jobs at once (the GPUs read once)."""
    waiting = [job for job in jobs if job.status in WAITING]
    if not waiting:
        return {}
    now = timezone.now()
    state = holdings(now)
    answers: dict[int, Estimate] = {}
    for job in waiting:
        found = estimate(job, now=now, state=state)
        if found is not None:
            answers[job.pk] = found
    return answers
