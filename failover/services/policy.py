"""The Job Failover policy: judge a failed run, then re-place it, refuse it, or give up.

Order for a run that stopped while its job was Running with failover on: its node's agent stores
what the node shows (``HealthChecker.before_failed_exit``: facts only), then reports the exit:
``Running → Pending - failoverinprogress`` (``handle_failed_run``). The control plane's next round
judges the attempt, once (``judge_exited`` → ``decide``): its stored evidence (no probe here, no
transaction open) → classify → hardware: exclude the faulty node (or GPUs) for this job, count
the failover and leave the job to placement (``→ Running`` on a healthy node, resuming from its
latest checkpoint); non-hardware: ``→ Pending - internalerror``; limit spent:
``→ Pending - maxretriesexceeded``. The attempt is *claimed* first (its verdict set to ``judging``
by compare-and-swap), so one fault is judged, and counted, once however many control workers see
it; a claim older than ``CLAIM_TIMEOUT`` (its judge crashed) is taken over.

Evidence is scoped to the attempt: the node's health events on its GPUs (or node-wide) stored
since it was placed. Node and GPU health are not written here: ``health.derive_health`` writes
them from the same events when they are stored. The run's own output may make the verdict
"hardware" and exclude its nodes *for this job*, but never marks a node unhealthy (DESIGN.md,
Trust).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import F, Min, Q, Value
from django.db.models.functions import Least
from django.utils import timezone

from agent.local_agents import local_agents, serves_node
from failover.classify import NodeFault, Verdict, classify_failure, node_fault
from failover.services.health import ScopedEvidence, scoped_evidence
from jobs import heartbeats
from jobs.backends.facts import Ended, EndKind, describe
from jobs.heartbeats import beat_interval
from jobs.models import GPU, AttemptNode, JobAttempt, JobExclusion, Node, TrainingJob
from jobs.services.control import earliest, postgres_transaction, timed_rounds, unix
from jobs.services.lifecycle import record_reason, transition
from jobs.services.messages import request_placement, wake_agents
from jobs.services.placement import release_part_gpus
from jobs.services.runs import record_exit
from jobs.statuses import JobStatus
from logs.queries import last_lines

logger = logging.getLogger(__name__)

LAST_LINES = 50
JUDGING = "judging"  # JobAttempt.verdict while a judge holds the claim
CLAIM_TIMEOUT = timedelta(seconds=120)


def handle_failed_run(job: TrainingJob, attempt: JobAttempt, outcome: str, lost: bool) -> str:
    """The hook jobs calls when a Running job's run fails and Job Failover is on: the job moves
    to ``Pending - failoverinprogress`` and the control plane is asked for a round, whose
    ``judge_exited`` reaches the attempt's one verdict. The reporter (a node agent) judges
    nothing: it stored its node's evidence before reporting the exit (``before_failed_exit``)."""
    moved = transition(
        job.pk,
        JobStatus.FAILOVER_IN_PROGRESS,
        reason=f"run stopped ({outcome}); checking the node's GPUs and hardware",
        actor="failover",
        attempt=attempt.number,
        expected={JobStatus.RUNNING},
        evidence={"exit_code": attempt.exit_code, "exit_signal": attempt.exit_signal},
    )
    if not moved:
        return TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk)
    request_placement()  # scale-out: a control round now (embedded: the status change wakes one)
    return JobStatus.FAILOVER_IN_PROGRESS


def judge(job_id: int, attempt_id: int) -> str:
    """``decide`` on a claimed attempt. A judge the database failed (SQLite held by a writer past
    its busy timeout, PostgreSQL gone) gives its claim back before the error goes on up the
    round: the next round judges the attempt instead of waiting out ``CLAIM_TIMEOUT``. Nothing
    was stored: the verdict commits with its consequences or not at all."""
    try:
        return decide(job_id, attempt_id, lost=False)
    except OperationalError:
        try:
            JobAttempt.objects.filter(pk=attempt_id, verdict=JUDGING).update(verdict="", judged_at=None)
        except OperationalError:
            logger.warning("job %s: could not give back the claim on attempt %s", job_id, attempt_id)
        raise


def claim(attempt: JobAttempt) -> bool:
    """Take the right to judge an exited attempt: its verdict goes from "" to ``judging`` (or a
    claim whose judge went silent is taken over), by compare-and-swap on the attempt row."""
    now = timezone.now()
    unjudged = JobAttempt.objects.filter(pk=attempt.pk, state=JobAttempt.State.EXITED)
    if unjudged.filter(verdict="").update(verdict=JUDGING, judged_at=now):
        return True
    current = unjudged.filter(verdict=JUDGING).values_list("judged_at", flat=True).first()
    if current is None or current > now - CLAIM_TIMEOUT:
        return False
    return bool(unjudged.filter(verdict=JUDGING, judged_at=current).update(judged_at=now))


def gather(attempt: JobAttempt, parts: list[AttemptNode]) -> tuple[dict[int, ScopedEvidence], list[str]]:
    """Evidence for a judgement, all of it stored: per node, its health events on the attempt's
    GPUs (or node-wide) since it was placed; and the run's last output lines."""
    per_node = {part.node.pk: scoped_evidence(part.node, gpus=part.gpu_indices, since=attempt.created_at) for part in parts}
    lines = last_lines(attempt.job_id, attempt=attempt.number, count=LAST_LINES)
    return per_node, lines


def fault_of(attempt: JobAttempt) -> str | None:
    """The hardware fault its nodes' own evidence shows on the attempt's GPUs (or node-wide) since
    it was placed, in the health writer's words, or None: what a run ended with Job Failover off
    was killed for."""
    per_node, _ = gather(attempt, list(attempt.placements.select_related("node")))
    for evidence in per_node.values():
        fault = node_fault(evidence.findings, evidence.kernel_findings, evidence.kernel_log)
        if fault is not None:
            return fault.reason
    return None


def lost_parts(parts: list[AttemptNode]) -> list[AttemptNode]:
    """Ranks ended by the lost-node sweep: no exit seen, on a node that is NotReady."""
    return [p for p in parts if p.node.state == Node.State.NOT_READY and p.exit_code is None and p.exit_signal is None]


def decide(job_id: int, attempt_id: int, *, lost: bool = False) -> str:
    """Judge a claimed attempt, store the verdict, and act on it."""
    attempt = JobAttempt.objects.select_related("job").get(pk=attempt_id)
    job = attempt.job
    parts = list(attempt.placements.select_related("node"))
    gone = lost_parts(parts)
    exclude: dict[int, list[int]] = {}  # node → GPUs excluded for this job (empty: the node)
    faults: dict[int, NodeFault] = {}  # node → what its own evidence says is broken (not marked here)
    by_gpu = settings.FAILOVER_EXCLUDE == "gpu"
    if lost or gone:
        gone = gone or parts
        names = ", ".join(p.node.name for p in gone)
        # The sweep's cause already names the loss ("node node-a lost (no heartbeat for 12s)"): said once.
        reason = attempt.cause if lost and attempt.cause else f"node {names} lost: {attempt.cause}"
        since = {k: v for k, v in attempt.evidence.items() if k == "last_heartbeat"}  # stored by end_lost_part
        verdict = Verdict(hardware=True, reason=reason, evidence={"source": "heartbeat", "cause": attempt.cause, **since})
        # A silent node is NotReady until its heartbeat returns; that alone is no hardware
        # reading, so it is excluded for this job but not marked unhealthy.
        exclude = {p.node_id: [] for p in gone}
    else:
        per_node, lines = gather(attempt, parts)
        verdict = classify_failure(
            exit_code=attempt.exit_code,
            exit_signal=attempt.exit_signal,
            findings=[f for e in per_node.values() for f in e.findings],
            kernel_findings=[f for e in per_node.values() for f in e.kernel_findings],
            kernel_log="\n".join(e.kernel_log for e in per_node.values() if e.kernel_log),
            log_lines=lines,
        )
        for node_id, evidence in per_node.items():
            # What the node's own evidence alone blames (the health writer marks the same, from the
            # same events): the job is excluded from the faulty GPUs with FAILOVER_EXCLUDE=gpu (and
            # a GPU-scoped fault), else from the node.
            fault = node_fault(evidence.findings, evidence.kernel_findings, evidence.kernel_log)
            if fault is not None:
                faults[node_id] = fault
                exclude[node_id] = sorted(fault.gpus) if by_gpu and fault.gpus and not fault.node else []
        if verdict.hardware and not faults:
            # Only the run's own output (or supporting evidence with an ambiguous failure) told:
            # its nodes are excluded for this job, and nobody else's placement changes.
            exclude = {p.node_id: list(p.gpu_indices) if by_gpu else [] for p in parts}
            verdict = Verdict(hardware=True, reason=verdict.reason, evidence={**verdict.evidence, "scope": "this job only"})
    # The verdict and what it implies (exclusions, the failover counted, the status) commit
    # together: a write refused after the verdict's compare-and-swap rolls both back, and the
    # claim given back (``judge``) lets the next round judge it again. (Stored alone, a hardware
    # verdict made placement re-place the job with no exclusion and no failover counted.)
    with transaction.atomic():
        stored = JobAttempt.objects.filter(pk=attempt.pk, verdict=JUDGING).update(
            verdict=verdict.verdict, verdict_reason=verdict.reason[:500], evidence=verdict.evidence, judged_at=timezone.now()
        )
        if not stored:
            logger.info("job %s: attempt %s was judged by another worker", job.pk, attempt.number)
            return TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk)
        return apply_verdict(job, attempt, verdict, exclude)


def apply_verdict(job: TrainingJob, attempt: JobAttempt, verdict: Verdict, exclude: dict[int, list[int]]) -> str:
    expected = {JobStatus.FAILOVER_IN_PROGRESS}
    if not verdict.hardware:
        transition(
            job.pk,
            JobStatus.INTERNAL_ERROR,
            reason=f"failover refused: {verdict.reason}; no hardware fault found, read the logs",
            actor="failover",
            attempt=attempt.number,
            expected=expected,
            evidence=verdict.evidence,
        )
        return JobStatus.INTERNAL_ERROR
    count = TrainingJob.objects.values_list("failover_count", flat=True).get(pk=job.pk)
    if count >= settings.MAX_FAILOVERS:
        transition(
            job.pk,
            JobStatus.MAX_RETRIES_EXCEEDED,
            reason=f"failover limit ({settings.MAX_FAILOVERS}) spent; last fault: {verdict.reason}",
            actor="failover",
            attempt=attempt.number,
            expected=expected,
            evidence=verdict.evidence,
        )
        return JobStatus.MAX_RETRIES_EXCEEDED
    with transaction.atomic():
        for node_id, gpus in exclude.items():
            targets: list[int | None] = [*gpus] or [None]  # no GPU named: the whole node
            for gpu in targets:
                JobExclusion.objects.get_or_create(job=job, node_id=node_id, gpu=gpu, defaults={"reason": verdict.reason[:500]})
        record_reason(
            job.pk,
            reason=f"hardware fault ({verdict.reason}); re-placing on a healthy node",
            expected=expected,
            actor="failover",
            attempt=attempt.number,
            evidence=verdict.evidence,
            # The claim makes this run once per fault; the cap holds even if it did not.
            failover_count=Least(F("failover_count") + 1, Value(settings.MAX_FAILOVERS)),
        )
    names = ", ".join(Node.objects.filter(pk__in=exclude).values_list("name", flat=True))
    logger.warning("job %s: hardware fault on %s (%s); failing over", job.pk, names, verdict.reason)
    return JobStatus.FAILOVER_IN_PROGRESS


def judge_exited() -> None:
    """The control plane's judge: the latest exited attempt of each job in failover with no
    verdict yet (its exit just reported), or with a claim whose judge went silent, is claimed
    and judged, once."""
    stale = timezone.now() - CLAIM_TIMEOUT
    for attempt in (
        JobAttempt.objects.filter(job__status=JobStatus.FAILOVER_IN_PROGRESS, state=JobAttempt.State.EXITED)
        .filter(Q(verdict="") | Q(verdict=JUDGING, judged_at__lt=stale))
        .order_by("job_id", "-number")
    ):
        latest = attempt.job.attempts.order_by("-number").values_list("number", flat=True).first()
        if attempt.number == latest and claim(attempt):
            judge(attempt.job_id, attempt.pk)


def end_stranded_failovers() -> None:
    """A job waiting to fail over whose every node that could hold it is excluded (each faulted
    under it) waits ``FAILOVER_REPAIR_WAIT`` for an operator's repair, which lifts the exclusion;
    then it ends ``Pending - maxretriesexceeded``: no re-placement can happen."""
    now = timezone.now()
    open_attempts = JobAttempt.objects.filter(state__in=[JobAttempt.State.PLACED, JobAttempt.State.RUNNING])
    waiting = TrainingJob.objects.filter(status=JobStatus.FAILOVER_IN_PROGRESS).exclude(pk__in=open_attempts.values("job_id"))
    for job in waiting.filter(exclusions__isnull=False).distinct():
        last = job.attempts.order_by("-number").first()
        if last is None or last.verdict != "hardware" or eligible_nodes(job) >= job.node_count:
            continue
        if last.judged_at and now - last.judged_at < timedelta(seconds=settings.FAILOVER_REPAIR_WAIT):
            continue
        excluded = ", ".join(sorted(set(job.exclusions.values_list("node__name", flat=True))))
        transition(
            job.pk,
            JobStatus.MAX_RETRIES_EXCEEDED,
            reason=(
                f"failover stopped after {job.failover_count} failover(s): no node left that can hold the job "
                f"(excluded after faults: {excluded}; none repaired within {settings.FAILOVER_REPAIR_WAIT:.0f}s)"
            ),
            actor="failover",
            attempt=last.number,
            expected={JobStatus.FAILOVER_IN_PROGRESS},
            evidence={"excluded": excluded},
        )


def eligible_nodes(job: TrainingJob) -> int:
    """Nodes (in any state: a lost or faulty one may come back) with enough GPUs the job is not
    excluded from."""
    excluded_nodes = set(job.exclusions.filter(gpu__isnull=True).values_list("node_id", flat=True))
    excluded_gpus = set(job.exclusions.filter(gpu__isnull=False).values_list("node_id", "gpu"))
    usable: dict[int, int] = {}
    for node_id, index in GPU.objects.exclude(node_id__in=excluded_nodes).values_list("node_id", "index"):
        if (node_id, index) not in excluded_gpus:
            usable[node_id] = usable.get(node_id, 0) + 1
    return sum(1 for count in usable.values() if count >= job.gpus_per_node)


def sweep_lost_nodes() -> None:
    """Nodes whose agent stopped reporting are lost; their runs end and fail over.

    A node's last beat is the newer of Redis's (scale-out: ``jobs.heartbeats``, read for the
    stale names only) and the database's ``Node.last_heartbeat``, so one indexed query finds the
    few candidates whatever the fleet's size, and a Redis flush loses no node. Nodes an agent of
    this process serves are never swept here: that agent beats for them from this very process,
    so a late beat means this process stalled (say, on a database lock), not the node.

    A mass heartbeat loss (more than ``NODE_LOST_MAX_FRACTION`` of the Ready nodes, and more
    than 3) is taken as a control-plane or broker outage: no node is marked, and every node gets a
    fresh full timeout once beats resume. On a multi-node run the ranks on surviving nodes are
    stopped by their agents (SIGTERM, then SIGKILL after the grace period); the attempt closes,
    and their GPUs are freed, when the last of them has exited.
    """
    global _last_outage
    now = timezone.now()
    timeout = settings.NODE_HEARTBEAT_TIMEOUT
    deadline = now.timestamp() - timeout
    # Missing beats for this long already counts towards a mass loss: the silent nodes of an
    # outage cross the timeout one by one (their last beats were spread over a beat interval),
    # so the outage must be seen before the first of them is past it.
    suspect_before = now.timestamp() - min(timeout / 2, 3 * beat_interval())
    redis_beats: dict[str, float] = {}
    outage = _last_outage
    if settings.SCALE_OUT:
        try:
            redis_beats = heartbeats.stale(suspect_before)
            outage = max(outage or 0.0, heartbeats.last_outage() or 0.0)
        except Exception as exc:
            logger.error("lost-node sweep skipped: the heartbeat store is unavailable (%s)", exc)
            _last_outage = now.timestamp()
            return
    if outage and outage > deadline:
        return  # beats were away for everyone a moment ago: a full timeout from then
    # Scale-out: the database's beat is written only every NODE_HEARTBEAT_DB_INTERVAL, so alone (no
    # beat in Redis: a flush) it makes a node lost only that long past the timeout; Redis's beats
    # hold the short lease and name the rest.
    db_before = heartbeats.db_deadline(now.timestamp()) if settings.SCALE_OUT else suspect_before
    candidates = list(
        Node.objects.filter(state=Node.State.READY)
        .filter(Q(last_heartbeat__lt=datetime.fromtimestamp(db_before, tz=UTC)) | Q(name__in=list(redis_beats)))
        .values_list("pk", "name", "last_heartbeat")
    )
    if settings.SCALE_OUT:
        missing = [name for _, name, _ in candidates if name not in redis_beats]
        redis_beats.update(heartbeats.scores(missing))
    suspects = []
    for pk, name, db_beat in candidates:
        last = max(redis_beats.get(name, 0.0), db_beat.timestamp() if db_beat else 0.0)
        if last < suspect_before and not serves_node(name):
            suspects.append((pk, name, last))
    lost = [s for s in suspects if s[2] < deadline]  # (a node with no beat in Redis is a candidate only past db_before)
    if len(suspects) > 3 and len(suspects) > settings.NODE_LOST_MAX_FRACTION * Node.objects.filter(state=Node.State.READY).count():
        logger.error(
            "mass heartbeat loss: %s of the Ready nodes missed their beats (%s past the %ss timeout), assuming a control-plane "
            "or broker outage; none marked NotReady",
            len(suspects),
            len(lost),
            int(timeout),
        )
        _last_outage = now.timestamp()
        if settings.SCALE_OUT:
            try:
                heartbeats.note_outage(_last_outage, keep_for=timeout)
            except Exception:
                logger.warning("could not note the heartbeat outage in Redis", exc_info=True)
        return
    for pk, name, last in lost:
        reason = f"no heartbeat for {int(now.timestamp() - last)}s" if last else "no heartbeat"
        lose_node(pk, name, reason, last)


def sweep_backend_down_nodes() -> None:
    """Nodes a cluster's scheduler took as down (Slurm: ``DOWN``, its slurmd silent past
    ``SlurmdTimeout``) are lost, whoever beats for them: their runs end and fail over, as a node
    whose agent stopped beating. Slurm's own record, not a guess from our heartbeats. Only a
    cluster's agent writes a node's scheduler state (``Node.backend_state``): on the agents the
    query finds nothing, whichever backend this process was started with."""
    for pk, name, state, why, last in Node.objects.filter(state=Node.State.READY, backend_state__contains="DOWN").values_list(
        "pk", "name", "backend_state", "backend_reason", "last_heartbeat"
    ):
        lose_node(pk, name, f"Slurm has it {state}" + (f": {why}" if why else ""), last.timestamp() if last else 0.0)


def lose_node(pk: int, name: str, reason: str, last: float) -> None:
    """The node is NotReady (lost) and each of its runs ends as lost."""
    if not Node.objects.filter(pk=pk, state=Node.State.READY).update(state=Node.State.NOT_READY, health_reason=f"lost: {reason}"[:300]):
        return
    if settings.SCALE_OUT:
        try:
            heartbeats.mark_lost([name])  # its agent, beating again, learns it must come back
        except Exception:
            logger.warning("could not mark %s lost in Redis", name, exc_info=True)
    logger.warning("node %s lost: %s", name, reason)
    for part in AttemptNode.objects.filter(
        node_id=pk, ended_at__isnull=True, attempt__state__in=[JobAttempt.State.RUNNING, JobAttempt.State.PLACED]
    ).select_related("attempt"):
        end_lost_part(part, Ended(EndKind.NODE_LOST, node=name, detail=reason), last_heartbeat=last or None)


_last_outage: float | None = None  # unix time this process last saw a mass heartbeat loss


def end_lost_part(part: AttemptNode, fact: Ended, *, last_heartbeat: float | None = None) -> None:
    """Close a lost node's rank (``fact``: its node lost). ``last_heartbeat`` (unix time) goes into the attempt's evidence:
    the outage began then, and ``satrain_failover_recovery_seconds`` counts from it."""
    now = timezone.now()
    if not AttemptNode.objects.filter(pk=part.pk, ended_at__isnull=True).update(ended_at=now):
        return
    terminate_orphan(part)
    release_part_gpus(part)
    attempt = part.attempt
    if last_heartbeat:
        # Not judged yet (the verdict overwrites the evidence and keeps this key); the earliest
        # lost node of a multi-node attempt counts.
        attempt.refresh_from_db(fields=["evidence"])
        known = attempt.evidence.get("last_heartbeat")
        attempt.evidence = {**attempt.evidence, "last_heartbeat": min(last_heartbeat, known) if known else last_heartbeat}
        JobAttempt.objects.filter(pk=attempt.pk, verdict="").update(evidence=attempt.evidence)
    # Ranks not started yet are ended here (claimed, so no agent starts them); started ones
    # are asked to stop.
    AttemptNode.objects.filter(attempt=attempt, ended_at__isnull=True, runner_pid__isnull=True).update(runner_pid=0, ended_at=now)
    for unstarted in AttemptNode.objects.filter(attempt=attempt, ended_at=now, runner_pid=0).exclude(pk=part.pk):
        release_part_gpus(unstarted)
    if AttemptNode.objects.filter(attempt=attempt, ended_at__isnull=True).exists():
        JobAttempt.objects.filter(pk=attempt.pk, stop_requested_at__isnull=True).update(stop_requested_at=now)
        wake_agents(attempts=[attempt.pk])
        logger.warning("job %s: %s; stopping the attempt's other ranks", attempt.job_id, describe(fact))
        return
    status = record_exit(attempt, fact)
    if status == JobStatus.FAILOVER_IN_PROGRESS and claim(attempt):
        # The attempt was being placed for a failover: the lost node is judged as a lost node.
        decide(attempt.job_id, attempt.pk, lost=True)


def terminate_orphan(part: AttemptNode) -> None:
    """Nothing is signalled from here: a pid read from a run's files names a process of the node it
    ran on, not of this host (with a shared ``JOB_WORK_ROOT`` a ``killpg`` here hit whatever group
    had that number). The part is closed (``ended_at``) without an exit, which is the record that
    the run must end: the node's own agent, beating again, ends it and delivers the lines it
    printed meanwhile (``NodeAgent.stop_strays``)."""
    logger.warning(
        "job %s: attempt %s rank %s on a lost node is left to its node's agent to end when it returns",
        part.attempt.job_id,
        part.attempt.number,
        part.rank,
    )


def control_round() -> float | None:
    """The failover share of a control round; returns when it next has timed work (embedded)."""
    sweep_lost_nodes()
    sweep_backend_down_nodes()
    judge_exited()
    end_stranded_failovers()
    return next_timed_work() if timed_rounds() else None


def next_timed_work() -> float | None:
    """The earliest moment one of this round's sweeps has work no event announces: a Ready node's
    heartbeat going stale (nodes this process serves are never swept), a mass heartbeat loss's
    hold ending, a stranded failover's ``FAILOVER_REPAIR_WAIT`` or a silent judge's
    ``CLAIM_TIMEOUT`` running out. Only moments still ahead. Two reads, one transaction on
    PostgreSQL."""
    now = timezone.now()
    timeout = timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT)
    repair = timedelta(seconds=settings.FAILOVER_REPAIR_WAIT)
    here = sorted({name for agent in local_agents() for name in agent.node_names})
    with postgres_transaction():
        beat = Node.objects.filter(state=Node.State.READY, last_heartbeat__gt=now - timeout).exclude(name__in=here).aggregate(oldest=Min("last_heartbeat"))
        judged = JobAttempt.objects.filter(job__status=JobStatus.FAILOVER_IN_PROGRESS, judged_at__gt=now - max(repair, CLAIM_TIMEOUT)).aggregate(
            stranded=Min("judged_at", filter=Q(verdict="hardware", judged_at__gt=now - repair)),
            claimed=Min("judged_at", filter=Q(verdict=JUDGING, judged_at__gt=now - CLAIM_TIMEOUT)),
        )
    outage_over = _last_outage + timeout.total_seconds() if _last_outage else None
    return earliest(
        [
            unix(beat["oldest"], timeout),
            outage_over if outage_over and outage_over > now.timestamp() else None,
            unix(judged["stranded"], repair),
            unix(judged["claimed"], CLAIM_TIMEOUT),
        ]
    )
