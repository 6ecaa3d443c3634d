"""Placement: the fair-share queue's rounds (``jobs.fairshare`` decides; this module reads the
database for it and carries the plan out), GPU holds by compare-and-swap, image-pull back-off."""

from __future__ import annotations

import logging
import re
from collections import Counter, defaultdict
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Max, OuterRef, Q, Subquery, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from jobs.backends.base import state_takes_work
from jobs.backends.facts import EndKind
from jobs.fairshare import Capacity, HeldOut, ProjectShare, SpotRun, WaitingJob, decayed, plan_round
from jobs.models import GPU, AttemptNode, JobAttempt, JobExclusion, Node, Project, TrainingJob
from jobs.services.bulk import update_each
from jobs.services.lifecycle import PLACEMENT, REASON_CHARS, record_placements, record_queue_reasons, record_reason, transition
from jobs.services.messages import dispatch_launch, dispatch_launches, wake_agents
from jobs.statuses import WAITING, JobStatus

logger = logging.getLogger(__name__)


MASTER_PORT_BASE = 29500
MASTER_PORT_SPAN = 20000


# GPUs claimed per statement (SQLite binds at most 32,766 parameters; three per GPU here).
CLAIM_CHUNK = 1000


class PlacementConflict(Exception):
    """Another placement took a GPU between reading the free ones and holding them, or a job
    changed status since the round read it."""


class Placed(list):
    """The attempts one placement round created. ``more`` is True when some project's full
    window of one shape was placed whole: the jobs behind it may fit at once, so the control
    round goes on rather than waiting for the next beat."""

    def __init__(self, attempts=(), *, more: bool = False) -> None:
        super().__init__(attempts)
        self.more = more


def read_capacity(now) -> tuple[Capacity, dict[tuple[int, int], int]]:
    """Free GPUs of Ready, healthy, uncordoned nodes, by node name; which nodes hold off Spot;
    the free capacity of Ready, uncordoned nodes that health holds out (the waiting jobs'
    reasons name it); and each free GPU's row id by (node, index), for the claim. Three queries
    whatever the fleet's size: the free GPUs are read from their own table alone and kept for
    schedulable nodes here (no list of a thousand node ids, no join whose plan rests on fresh
    statistics)."""
    rows = list(
        Node.objects.order_by("name").values_list("id", "name", "address", "state", "healthy", "cordoned", "health_reason", "unhealthy_since", "backend_state")
    )
    names = {node_id: name for node_id, name, *_ in rows}
    usable = {row[0]: row[:8] for row in rows if row[3] == Node.State.READY and not row[5]}
    # A cluster backend's drained or lost node (Slurm's DRAIN, DOWN) takes no new attempt.
    schedulable = {row[0] for row in rows if row[0] in usable and row[4] and state_takes_work(row[8])}
    free: dict[int, list[int]] = defaultdict(list)
    held: dict[int, list[tuple[int, str, object]]] = defaultdict(list)  # node → its free unhealthy GPUs
    gpu_ids: dict[tuple[int, int], int] = {}
    for gpu_id, node_id, index, healthy, reason, since in (
        GPU.objects.filter(allocated_to__isnull=True).order_by("index").values_list("id", "node_id", "index", "healthy", "health_reason", "unhealthy_since")
    ):
        if node_id in schedulable and healthy:
            free[node_id].append(index)
            gpu_ids[(node_id, index)] = gpu_id
        elif node_id in usable and (not healthy or not usable[node_id][4]):  # health holds it out (not a backend's drain)
            held[node_id].append((index, reason, since))
    held_out: list[HeldOut] = []
    for node_id, (_, name, _, _, healthy, _, reason, since) in usable.items():
        if not healthy:
            gpus = tuple(sorted(i for i, *_ in held[node_id]))
            held_out.append(HeldOut(node_id, name, gpus, True, short_cause(reason), when(since)))
            continue
        by_fault: dict[tuple[str, str], list[int]] = defaultdict(list)
        for index, gpu_reason, gpu_since in held[node_id]:
            by_fault[(short_cause(gpu_reason), when(gpu_since))].append(index)
        held_out += [HeldOut(node_id, name, tuple(g), False, cause, at) for (cause, at), g in by_fault.items()]
    spot_held = frozenset(Node.objects.filter(spot_reclaimed_until__gt=now).values_list("id", flat=True))
    capacity = Capacity(
        nodes=[(n, names[n]) for n in names if n in schedulable],
        free=dict(free),
        spot_held=spot_held,
        addresses={n: row[2] for n, row in usable.items() if n in schedulable},
        held_out=tuple(held_out),
        names=names,
    )
    return capacity, gpu_ids


def move_holds(part: AttemptNode, indices: list[int], node: Node | None = None) -> None:
    """A cluster's scheduler runs the rank elsewhere than placement held: on other GPUs of its
    node, or on another ``node`` (it places, knowing the cluster's other work). The holds and the
    rank follow the scheduler, which is the authority there; rank 0's node is the attempt's
    ``MASTER_ADDR``."""
    node = node or part.node
    with transaction.atomic():
        GPU.objects.filter(allocated_to=part).update(allocated_to=None)
        GPU.objects.filter(node_id=node.pk, index__in=indices).update(allocated_to=part)
        AttemptNode.objects.filter(pk=part.pk).update(gpu_indices=list(indices), node=node)
        if part.rank == 0 and node.pk != part.node_id:
            JobAttempt.objects.filter(pk=part.attempt_id).update(master_addr=node.address)
    part.gpu_indices = list(indices)
    part.node = node


_CAUSE = re.compile(r"\b(S?Xid \d+)")


def short_cause(reason: str) -> str:
    """What a health reason names first, briefly: "Xid 79" for "Xid 79 on GPU 0: GPU has fallen
    off the bus", the words before a GPU or a colon otherwise."""
    found = _CAUSE.search(reason or "")
    if found:
        return found.group(1)
    return re.split(r" on GPU|:", reason or "", maxsplit=1)[0].strip()[:80]


def when(moment) -> str:
    """A time as the console shows it in a reason: "18:20" today, "Dec 01 18:20" before ("": not known)."""
    if moment is None:
        return ""
    local = timezone.localtime(moment)
    return local.strftime("%H:%M" if local.date() == timezone.localdate() else "%b %d %H:%M")


# What a round reads of a waiting job (a placed one is read again in full when held).
QUEUE_FIELDS = (
    "id",
    "project_id",
    "gpus_per_node",
    "node_count",
    "priority",
    "created_at",
    "job_type",
    "image",
    "status",
    "status_reason",
    "next_retry_at",
    "pull_attempts",
)


def waiting_heads(window: int) -> list[TrainingJob]:
    """The waiting jobs the round looks at: each project's first ``window`` jobs of each shape
    (GPUs per node × nodes), by priority then age. A round can place at most a few jobs of a
    shape per project, and tells exact places only up to ``PLACES_SHOWN``; the jobs behind them
    wait their turn whatever their number, so the round's work does not grow with the queue."""
    open_attempts = JobAttempt.objects.filter(state__in=[JobAttempt.State.PLACED, JobAttempt.State.RUNNING])
    # Failovers waiting for a place: those whose last run was judged a hardware fault. They are
    # few, so they are found first and the window runs over plain index columns.
    last_verdict = JobAttempt.objects.filter(job_id=OuterRef("pk")).order_by("-number").values("verdict")[:1]
    failing_over = list(
        TrainingJob.objects.filter(status=JobStatus.FAILOVER_IN_PROGRESS)
        .annotate(last_verdict=Subquery(last_verdict))
        .filter(last_verdict="hardware")
        .values_list("pk", flat=True)
    )
    line = Window(
        RowNumber(),
        partition_by=[F("project_id"), F("gpus_per_node"), F("node_count")],
        order_by=[F("priority").desc(), F("created_at").asc(), F("id").asc()],
    )
    # The ranking reads only columns of the job_queue_line index; the rows themselves are read
    # for the jobs in the window alone.
    heads = (
        TrainingJob.objects.filter(Q(status__in=[JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF]) | Q(pk__in=failing_over))
        .exclude(pk__in=open_attempts.values("job_id"))
        .annotate(line_no=line)
        .filter(line_no__lte=window)
        .values("pk")
    )
    return list(TrainingJob.objects.filter(pk__in=heads).order_by("created_at", "id").only(*QUEUE_FIELDS))


def project_shares(now, waiting_projects: set[int]) -> dict[int, ProjectShare]:
    """Every project with a quota, holdings or usage: what it holds now, its decayed usage
    brought up to ``now`` (written back, one row per project), its quota and limits."""
    held: dict[int, int] = defaultdict(int)
    cpu_jobs: dict[int, int] = defaultdict(int)
    open_parts = AttemptNode.objects.filter(attempt__state__in=[JobAttempt.State.PLACED, JobAttempt.State.RUNNING], rank=0)
    for project_id, gpus, nodes in open_parts.values_list("attempt__job__project_id", "attempt__job__gpus_per_node", "attempt__job__node_count"):
        held[project_id] += gpus * nodes
        cpu_jobs[project_id] += gpus == 0
    half_life = settings.QUEUE_USAGE_HALF_LIFE
    shares: dict[int, ProjectShare] = {}
    touched: list[Project] = []
    projects = Project.objects.filter(Q(pk__in=list(held) + list(waiting_projects)) | Q(gpu_quota__gt=0) | Q(usage_gpu_seconds__gt=1.0))
    for project in projects.only("id", "gpu_quota", "gpu_borrow_limit", "cpu_job_limit", "usage_gpu_seconds", "usage_at"):
        seconds = (now - project.usage_at).total_seconds() if project.usage_at else 0.0
        usage = decayed(project.usage_gpu_seconds, held_gpus=held[project.pk], seconds=seconds, half_life=half_life)
        if seconds > 0 or project.usage_at is None:
            project.usage_gpu_seconds, project.usage_at = usage, now
            touched.append(project)
        shares[project.pk] = ProjectShare(
            quota=project.gpu_quota,
            borrow_limit=project.gpu_borrow_limit,
            cpu_job_limit=settings.QUEUE_CPU_JOBS_PER_PROJECT if project.cpu_job_limit is None else project.cpu_job_limit,
            used_gpus=held[project.pk],
            used_cpu_jobs=cpu_jobs[project.pk],
            usage=usage,
        )
    Project.objects.bulk_update(touched, ["usage_gpu_seconds", "usage_at"])
    return shares


def running_spot(now) -> list[SpotRun]:
    """Running Spot jobs not yet asked to stop, with their GPUs (bounded by the cluster's size)."""
    runs: dict[int, SpotRun] = {}
    parts = AttemptNode.objects.filter(
        attempt__state=JobAttempt.State.RUNNING,
        attempt__stop_requested_at__isnull=True,
        attempt__job__job_type=TrainingJob.JobType.SPOT,
        attempt__job__status=JobStatus.RUNNING,
    ).values_list("attempt__job_id", "attempt__job__project_id", "attempt__started_at", "node_id", "gpu_indices")
    for job_id, project_id, started, node_id, indices in parts:
        run = runs.get(job_id) or SpotRun(job_id, project_id, (started or now).timestamp(), ())
        runs[job_id] = SpotRun(run.job, run.project, run.started, (*run.gpus, (node_id, tuple(indices or []))))
    return [r for r in runs.values() if any(idx for _, idx in r.gpus)]


def place_waiting_jobs(*, window: int | None = None) -> Placed:
    """One round of the fair-share queue (``jobs.fairshare``); returns the attempts created.

    Waiting are Pending jobs, image-pull back-offs whose retry is due, and failovers judged a
    hardware fault. A job never lands on a node (or GPU) it was excluded from, and a Spot job not
    on a node whose spot capacity was just reclaimed. Every job looked at that is not placed
    keeps waiting with a reason and its place in line; Spot runs yield to On-Demand jobs within
    their project's quota; a job waiting past ``QUEUE_RESERVE_AFTER`` reserves capacity.
    """
    now = timezone.now()
    window = window or settings.QUEUE_WINDOW
    candidates = waiting_heads(window)
    shares = project_shares(now, {job.project_id for job in candidates})
    if not candidates:
        return Placed()
    # The node pulls the image (agent.launch); a failed pull waits here for its retry, and is
    # placed again in Pending - imagepullbackoff: it leaves that status only once a pull succeeds
    # (``runs.image_pulled``).
    ready = [job for job in candidates if not (job.status == JobStatus.IMAGE_PULL_BACKOFF and job.next_retry_at and job.next_retry_at > now)]
    if not ready:
        return Placed()
    by_id = {job.pk: job for job in ready}
    excluded_nodes: dict[int, set[int]] = defaultdict(set)
    excluded_gpus: dict[int, set[tuple[int, int]]] = defaultdict(set)
    # Filtered by the jobs' status, not by a list of thousands of ids: both tables stay small.
    for job_id, node_id, gpu in JobExclusion.objects.filter(job__status__in=WAITING).values_list("job_id", "node_id", "gpu"):
        if job_id not in by_id:
            continue
        if gpu is None:
            excluded_nodes[job_id].add(node_id)
        else:
            excluded_gpus[job_id].add((node_id, gpu))
    yielded = set(
        JobAttempt.objects.filter(preempted_for__status__in=WAITING)
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=now - timedelta(seconds=settings.QUEUE_YIELD_HOLD)))
        .values_list("preempted_for", flat=True)
    ) & set(by_id)
    starving_before = now - timedelta(seconds=settings.QUEUE_RESERVE_AFTER)
    waiting = [
        WaitingJob(
            id=job.pk,
            project=job.project_id,
            gpus_per_node=job.gpus_per_node,
            node_count=job.node_count,
            priority=job.priority,
            created=job.created_at.timestamp(),
            spot=job.job_type == TrainingJob.JobType.SPOT,
            exclude_nodes=frozenset(excluded_nodes[job.pk]),
            exclude_gpus=frozenset(excluded_gpus[job.pk]),
            starving=job.created_at <= starving_before and job.total_gpus > 0,
            yielded_to=job.pk in yielded,
        )
        for job in ready
    ]
    capacity, gpu_ids = read_capacity(now)
    spot = running_spot(now) if any(not w.spot and w.total_gpus for w in waiting) else []
    plan = plan_round(
        waiting,
        shares,
        capacity,
        half_life=settings.QUEUE_USAGE_HALF_LIFE,
        spot_runs=spot,
        max_reservations=settings.QUEUE_RESERVATIONS,
    )
    placed = hold_placements([(by_id[wanted.id], chosen) for wanted, chosen in plan.placements], capacity=capacity, gpu_ids=gpu_ids)
    for job_id, victims in plan.preemptions.items():
        preempt_spot(victims, for_job=by_id[job_id], now=now)
    waiting_reasons = {pk: (by_id[pk].status, reason) for pk, reason in plan.reasons.items()}
    for pk, (status, reason) in list(waiting_reasons.items()):
        if status == JobStatus.IMAGE_PULL_BACKOFF:
            waiting_reasons[pk] = (status, pull_retry_reason(by_id[pk], f"due, {reason}"))
    changed = {pk: why for pk, why in waiting_reasons.items() if by_id[pk].status_reason != why[1]}
    record_queue_reasons({pk: why for pk, why in changed.items() if why[0] != JobStatus.IMAGE_PULL_BACKOFF})
    for pk, (status, reason) in changed.items():
        if status == JobStatus.IMAGE_PULL_BACKOFF:  # still why the job waits: said in place, no event
            record_reason(pk, reason=reason, expected={status}, actor=PLACEMENT, event=False)
    # A full window of one shape placed whole: the jobs behind it were not looked at.
    looked_at = Counter((job.project_id, job.gpus_per_node, job.node_count) for job in candidates)
    held = Counter((a.job.project_id, a.job.gpus_per_node, a.job.node_count) for a in placed)
    return Placed(placed, more=any(n >= window and held[line] == n for line, n in looked_at.items()))


def preempt_spot(victims: list[int], *, for_job: TrainingJob, now) -> None:
    """Ask Spot runs to yield: the agent sends SIGTERM (ckptlib saves a final checkpoint), waits
    the grace period, and their jobs go back to ``Pending`` to resume from that checkpoint later.
    Like an operator's reclaim, a preemption never counts as a failover."""
    attempts = JobAttempt.objects.filter(job_id__in=victims, state=JobAttempt.State.RUNNING, stop_requested_at__isnull=True, job__status=JobStatus.RUNNING)
    count = attempts.update(reclaimed=True, preempted_for=for_job, stop_requested_at=now)
    wake_agents(jobs=victims)
    logger.warning("jobs %s: preempted (%s runs) for On-Demand job %s within its project's quota", victims, count, for_job.pk)


def hold_placements(
    batch: list[tuple[TrainingJob, list[tuple[int, list[int]]]]], *, capacity: Capacity, gpu_ids: dict[tuple[int, int], int]
) -> list[JobAttempt]:
    """Hold a round's placements in one transaction with a fixed number of statements; if the
    batch raced (a GPU taken, an attempt number taken, a job changed since the round read it)
    it is rolled back and the
    jobs are held one by one, each in its own transaction, so only the raced ones wait."""
    if not batch:
        return []
    try:
        return hold_in_bulk(batch, capacity=capacity, gpu_ids=gpu_ids)
    except PlacementConflict as conflict:
        logger.warning("placement: a batch of %s jobs raced (%s); holding them one by one", len(batch), conflict)
    names = dict(capacity.nodes)
    placed: list[JobAttempt] = []
    for job, chosen in batch:
        try:
            placed.append(hold_placement(job, chosen, node_names=names, master_addr=capacity.addresses[chosen[0][0]]))
        except PlacementConflict:
            logger.info("job %s: placement raced with another; retrying next round", job.pk)
    return placed


def hold_in_bulk(batch: list[tuple[TrainingJob, list[tuple[int, list[int]]]]], *, capacity: Capacity, gpu_ids: dict[tuple[int, int], int]) -> list[JobAttempt]:
    """The attempts' numbers in one read, attempts and ranks in one insert each, every GPU claimed
    in one ``UPDATE … CASE`` by compare-and-swap (only while still free; a count short is a race:
    PlacementConflict rolls it all back), the reasons and events in bulk. Launches are
    registered before the live publishes, so after commit they leave first."""
    names = dict(capacity.nodes)
    with transaction.atomic():
        last = dict(
            JobAttempt.objects.filter(job_id__in=[job.pk for job, _ in batch])
            .order_by()
            .values("job_id")
            .annotate(last=Max("number"))
            .values_list("job_id", "last")
        )
        try:
            attempts = JobAttempt.objects.bulk_create(
                JobAttempt(
                    job=job,
                    number=last.get(job.pk, 0) + 1,
                    master_addr=capacity.addresses[chosen[0][0]],
                    master_port=master_port(job.pk, last.get(job.pk, 0) + 1),
                )
                for job, chosen in batch
            )
        except IntegrityError as exc:  # another round numbered an attempt of one of these jobs first
            raise PlacementConflict("an attempt number was taken by another placement") from exc
        parts = AttemptNode.objects.bulk_create(
            AttemptNode(attempt=attempt, node_id=node_id, rank=rank, gpu_indices=indices)
            for attempt, (_job, chosen) in zip(attempts, batch, strict=True)
            for rank, (node_id, indices) in enumerate(chosen)
        )
        claim_gpus({gpu_ids[(part.node_id, index)]: part.pk for part in parts for index in part.gpu_indices})
        dispatch_launches([(attempt.pk, [names.get(node_id, "") for node_id, _ in chosen]) for attempt, (_job, chosen) in zip(attempts, batch, strict=True)])
        reasons = {job.pk: placed_reason(chosen, names, job) for job, chosen in batch}
        retries = {job.pk for job, _ in batch if job.status == JobStatus.IMAGE_PULL_BACKOFF}
        changed = record_placements(
            {job.pk: (job.status, reasons[job.pk], attempt.number) for attempt, (job, _) in zip(attempts, batch, strict=True)}, in_place=retries
        )
        if len(changed) != len(batch):
            raise PlacementConflict(f"{len(batch) - len(changed)} job(s) changed status since the round read them")
    for attempt, (job, _chosen) in zip(attempts, batch, strict=True):
        logger.info("job %s: attempt %s %s", job.pk, attempt.number, reasons[job.pk])
    return attempts


def claim_gpus(claims: dict[int, int]) -> None:
    """GPU row id → the rank (AttemptNode) that holds it, each only while it is still free."""
    gpu_ids = list(claims)
    for start in range(0, len(gpu_ids), CLAIM_CHUNK):
        chunk = gpu_ids[start : start + CLAIM_CHUNK]
        held = update_each(GPU, "allocated_to", {gpu: claims[gpu] for gpu in chunk}, where={"allocated_to": None})
        if held != len(chunk):
            raise PlacementConflict(f"{len(chunk) - held} of {len(chunk)} GPUs were taken since the round read them")


def master_port(job_id: int, number: int) -> int:
    """A port per attempt, the same for every rank wherever its agent runs."""
    return MASTER_PORT_BASE + (job_id * 4 + number) % MASTER_PORT_SPAN


def placed_reason(chosen: list[tuple[int, list[int]]], node_names: dict[int, str], job: TrainingJob | None = None) -> str:
    """ "placed on node-a GPU 0; starting", or for an image-pull retry the pull's failure kept
    with where it is tried again."""
    names = ", ".join(f"{node_names.get(node_id, node_id)} GPU {','.join(map(str, indices)) or '-'}" for node_id, indices in chosen)
    if job is not None and job.status == JobStatus.IMAGE_PULL_BACKOFF:
        return pull_retry_reason(job, f"pulling again on {names}")
    return f"placed on {names}; starting"


def hold_placement(job: TrainingJob, chosen: list[tuple[int, list[int]]], *, node_names: dict[int, str], master_addr: str) -> JobAttempt:
    """Create the attempt and hold its GPUs by compare-and-swap, all in one transaction (the
    fallback when a round's batch raced)."""
    with transaction.atomic():
        number = (JobAttempt.objects.filter(job=job).aggregate(m=Max("number"))["m"] or 0) + 1
        try:
            attempt = JobAttempt.objects.create(job=job, number=number, master_addr=master_addr, master_port=master_port(job.pk, number))
        except IntegrityError as exc:
            raise PlacementConflict from exc
        for rank, (node_id, indices) in enumerate(chosen):
            part = AttemptNode.objects.create(attempt=attempt, node_id=node_id, rank=rank, gpu_indices=indices)
            held = GPU.objects.filter(node_id=node_id, index__in=indices, allocated_to__isnull=True).update(allocated_to=part)
            if held != len(indices):
                raise PlacementConflict
        dispatch_launch(attempt, [node_names.get(node_id, "") for node_id, _ in chosen])
        reason = placed_reason(chosen, node_names, job)
        retry = job.status == JobStatus.IMAGE_PULL_BACKOFF
        if not record_reason(job.pk, reason=reason, expected={job.status}, actor=PLACEMENT, attempt=number, event=not retry):
            raise PlacementConflict  # the job was stopped (or moved on) since the round read it
    logger.info("job %s: attempt %s %s", job.pk, number, reason)
    return attempt


# The tail a back-off reason carries after the pull's failure: "; retry 3 in 40s",
# "; retry 3: pulling again on node-a GPU 0", "; retry 3 due, 1st for 2 GPUs; …".
RETRY_TAIL = re.compile(r"; retry \d+\b.*\Z", re.S)


def pull_failure(reason: str) -> str:
    """The failure a back-off reason tells, without its retry tail."""
    return RETRY_TAIL.sub("", reason or "")


def pull_retry_reason(job: TrainingJob, what: str) -> str:
    """A back-off job's reason while its retry is due or under way: the failure, then ``what``."""
    return f"{pull_failure(job.status_reason)}; retry {job.pull_attempts}{'' if what.startswith('due') else ':'} {what}"


def back_off_image_pull(job_id: int, reason: str) -> None:
    """Record a failed image pull and when to try again (exponential, capped). The first failure
    moves the job to ``Pending - imagepullbackoff`` (an event); a retry that fails the same way
    updates that reason in place (the retry count and next time), and one that fails another
    way ("manifest unknown", then "connection refused") is an event of its own."""
    job = TrainingJob.objects.only("status", "status_reason", "pull_attempts").get(pk=job_id)
    tries = job.pull_attempts + 1 if job.status == JobStatus.IMAGE_PULL_BACKOFF else 1
    delay = min(settings.IMAGE_PULL_BACKOFF_BASE * 2 ** (tries - 1), settings.IMAGE_PULL_BACKOFF_MAX)
    next_retry = timezone.now() + timedelta(seconds=delay)
    reason = reason[: REASON_CHARS - 60]  # the retry tail always fits after it
    full_reason = f"{reason}; retry {tries} in {delay:.0f}s"
    if job.status != JobStatus.IMAGE_PULL_BACKOFF:
        transition(job_id, JobStatus.IMAGE_PULL_BACKOFF, reason=full_reason, pull_attempts=tries, next_retry_at=next_retry)
    else:
        record_reason(
            job_id,
            reason=full_reason,
            expected={JobStatus.IMAGE_PULL_BACKOFF},
            pull_attempts=tries,
            next_retry_at=next_retry,
            event=pull_failure(job.status_reason) != reason,
        )


def release_gpus(attempt: JobAttempt) -> None:
    GPU.objects.filter(allocated_to__attempt=attempt).update(allocated_to=None)


def abandon_open_attempts(job_id: int, *, cause: str, kind: EndKind = EndKind.ABANDONED) -> None:
    """Give up attempts that never started (the job was stopped, its image vanished, or (``kind``
    ``LAUNCH_FAILED``) its launch failed); ``cause`` says why."""
    now = timezone.now()
    for attempt in JobAttempt.objects.filter(job_id=job_id, state=JobAttempt.State.PLACED):
        with transaction.atomic():
            release_gpus(attempt)
            JobAttempt.objects.filter(pk=attempt.pk, state=JobAttempt.State.PLACED).update(
                state=JobAttempt.State.ABANDONED, ended_at=now, cause=cause[:500], end_kind=kind
            )


def release_part_gpus(part: AttemptNode) -> None:
    """Free one rank's GPUs (its node was lost, or it never started) while the others run on."""
    GPU.objects.filter(allocated_to=part).update(allocated_to=None)
