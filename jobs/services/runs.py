"""The facts a node agent reports about a job's run, and the decision each one leads to.

The agent touches the outside world (processes, files, images) and reports what it saw: it
claims a rank to start, the image was pulled (by digest), a rank's supervisor started (its pid,
the checkpoint step the node found), a rank exited with X, the image is not on the node, the
launch failed, the max run time is reached, it began stopping a run. The functions here decide
what that means for the job and make the change (a job's status through the one writer,
``jobs.services.lifecycle``); the agent writes no job, attempt or rank itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, Q
from django.utils import timezone

from jobs.backends import outcomes
from jobs.backends.facts import Ended, EndKind, describe, exited
from jobs.extensions import extensions
from jobs.models import AttemptNode, JobAttempt, Node, Project, TrainingJob
from jobs.services.lifecycle import record_reason, transition
from jobs.services.limits import StorageUse, job_storage_limit, storage_verdicts
from jobs.services.messages import request_placement, wake_agents
from jobs.services.placement import abandon_open_attempts, back_off_image_pull, move_holds, release_gpus
from jobs.statuses import WAITING, JobStatus

logger = logging.getLogger(__name__)

AGENT = "node-agent"
# A rank's ``runner_pid`` while an agent starts it (claimed, no supervisor yet).
CLAIMED = 0


def placement_text(attempt: JobAttempt) -> str:
    return ", ".join(f"{p.node.name} GPU {','.join(map(str, p.gpu_indices)) or '-'}" for p in attempt.placements.select_related("node"))


def yield_text(attempt: JobAttempt) -> str:
    """Why a Spot run gave its GPUs back: an operator's reclaim, or On-Demand work within quota."""
    if attempt.preempted_for_id is None:
        return "spot capacity reclaimed"
    job = TrainingJob.objects.filter(pk=attempt.preempted_for_id).values_list("name", "project__name").first()
    name, project = job or (f"#{attempt.preempted_for_id}", "its project")
    return f"preempted for On-Demand job {name} ({project}, within its quota)"


def abandon_unless_waiting(attempt: JobAttempt) -> bool:
    """Whether the attempt's job still waits for it; if not, the attempt is given up."""
    job = attempt.job
    if job.status in WAITING:
        return True
    abandon_open_attempts(job.pk, cause=f"job is {job.status}")
    return False


def claim_parts(attempt: JobAttempt, node_names: Sequence[str]) -> list[AttemptNode]:
    """The attempt's ranks on ``node_names`` that an agent may start now, each claimed by
    compare-and-swap (``CLAIMED``), so a duplicate launch or two agents never start one twice."""
    mine = attempt.placements.filter(node__name__in=node_names, runner_pid__isnull=True).select_related("node").order_by("rank")
    return [p for p in mine if AttemptNode.objects.filter(pk=p.pk, runner_pid__isnull=True).update(runner_pid=CLAIMED)]


def image_pulled(attempt: JobAttempt, part: AttemptNode, reference: str) -> None:
    """The node pulled the attempt's image as ``reference`` (by digest): rank 0's is the one the
    attempt ran, and a failover runs the same. A job that was backing off its pull is Pending
    again: the image is there now (said once, by the first rank to pull it)."""
    if part.rank == 0:
        JobAttempt.objects.filter(pk=attempt.pk).update(image_digest=reference)
        attempt.image_digest = reference
    job = attempt.job
    failed = TrainingJob.objects.filter(pk=job.pk, status=JobStatus.IMAGE_PULL_BACKOFF).values_list("pull_attempts", flat=True).first()
    if failed is None:
        return
    after = f" after {failed} failed pull{'s' if failed != 1 else ''}" if failed else ""
    transition(
        job.pk,
        JobStatus.PENDING,
        reason=f"image {job.image} is available: pulled as {reference} on {part.node.name}{after}; starting attempt {attempt.number}",
        actor=AGENT,
        attempt=attempt.number,
        expected={JobStatus.IMAGE_PULL_BACKOFF},
        pull_attempts=0,
        next_retry_at=None,
    )


def part_started(part: AttemptNode, *, runner_pid: int, workdir: str, resume_step: int | None = None) -> bool:
    """A rank's supervisor runs as ``runner_pid`` in ``workdir``; ``resume_step`` is the newest
    checkpoint the node found in the job's output (None: none, or a first attempt), rank 0's
    being the attempt's. The last rank to start makes the attempt Running (``run_started``).
    Returns False if the job moved on meanwhile (stopped, or the attempt ended): its agent ends
    the runs."""
    AttemptNode.objects.filter(pk=part.pk).update(runner_pid=runner_pid, workdir=workdir)
    part.runner_pid, part.workdir = runner_pid, workdir
    attempt = part.attempt
    if part.rank == 0 and resume_step is not None:
        JobAttempt.objects.filter(pk=attempt.pk).update(resume_step=resume_step)
    if attempt.placements.filter(Q(runner_pid__isnull=True) | Q(runner_pid=CLAIMED)).exists():
        return True  # other ranks are still being started (here, or by other agents)
    attempt.refresh_from_db(fields=["resume_step", "resume_source", "resume_detail"])
    return run_started(attempt)


def resume_chosen(attempt: JobAttempt, source: str, step: int | None, detail: str) -> None:
    """Where a re-placed attempt resumes from ("disk", "replica", "start"; ``agent.checkpointless``)
    and why; the first agent's choice stays (the others follow it)."""
    JobAttempt.objects.filter(pk=attempt.pk, resume_source="").update(resume_source=source, resume_step=step, resume_detail=detail[:500])


def stop_begun(attempt: JobAttempt) -> datetime:
    """The agent begins stopping the attempt's runs (its job is being stopped, or the attempt
    must end): the time its grace period runs from, recorded once and returned."""
    if attempt.stop_requested_at is None:
        now = timezone.now()
        JobAttempt.objects.filter(pk=attempt.pk, stop_requested_at__isnull=True).update(stop_requested_at=now)
        attempt.stop_requested_at = now
    return attempt.stop_requested_at


def image_unavailable(attempt: JobAttempt, claimed: Sequence[AttemptNode], why: str) -> None:
    """The node cannot pull the job's image for ``attempt`` (its ranks ``claimed`` here): give up
    the placement and retry later with back-off.

    A placement whose image never arrived started no process: it is no attempt of the job, so its
    row goes (GPUs freed) and the retry's placement takes the same number; the back-off's reason
    keeps why. Only when another agent holds a rank of it (a multi-node job, that rank being
    started elsewhere) is it kept, abandoned, for that agent to see and end."""
    ours = [part.pk for part in claimed]
    with transaction.atomic():
        others = AttemptNode.objects.filter(attempt=attempt).exclude(pk__in=ours)
        expected = others.count()
        # Hold every rank no agent has claimed yet (compare-and-swap), so none is started while
        # the placement goes; one short means another agent holds a rank.
        if others.filter(runner_pid__isnull=True).update(runner_pid=CLAIMED) == expected:
            release_gpus(attempt)
            forgotten = JobAttempt.objects.filter(pk=attempt.pk, state=JobAttempt.State.PLACED).delete()[0] > 0
        else:
            forgotten = False
    if forgotten:
        logger.info("job %s: placement %s given up before it started: %s", attempt.job_id, attempt.number, why)
    else:
        abandon_open_attempts(attempt.job_id, cause=why)
    back_off_image_pull(attempt.job_id, why)


def part_submitted(part: AttemptNode, handle: str) -> None:
    """The rank was handed to a cluster's scheduler as its job ``handle`` (Slurm's job id)."""
    AttemptNode.objects.filter(pk=part.pk).update(backend_job=handle)
    part.backend_job = handle


def part_moved(part: AttemptNode, node_name: str, indices: list[int]) -> None:
    """The cluster's scheduler started the rank on ``node_name``'s GPUs ``indices``, not where
    placement held (the run followed them)."""
    move_holds(part, indices, Node.objects.get(name=node_name))


def queued_by_scheduler(attempt: JobAttempt, reason: str) -> bool:
    """A cluster's scheduler (Slurm) holds the attempt's run in its queue: the job keeps waiting,
    with the scheduler's own reason (``Resources``, ``Priority``, ``ReqNodeNotAvail``, …)."""
    return record_reason(attempt.job_id, reason=reason, expected=WAITING, actor=AGENT, attempt=attempt.number)


def preempted_by_scheduler(attempt: JobAttempt, node_ids: Sequence[int]) -> None:
    """The cluster's scheduler preempted the attempt's Spot run for other work: its exit takes the
    job back to ``Pending`` (never a failover, ``record_exit``), and its nodes hold off Spot work
    for ``SPOT_RECLAIM_HOLD`` seconds, as an operator's reclaim does."""
    until = timezone.now() + timedelta(seconds=settings.SPOT_RECLAIM_HOLD)
    JobAttempt.objects.filter(pk=attempt.pk).update(reclaimed=True)
    Node.objects.filter(pk__in=list(node_ids)).update(spot_reclaimed_until=until)
    attempt.reclaimed = True


def launch_failed(attempt: JobAttempt, error: str) -> None:
    """The node could not start the run (its directories, its process): the job cannot go on
    (whatever it was doing: a job being stopped refuses the move, and its stop ends it)."""
    fact = Ended(EndKind.LAUNCH_FAILED, detail=error)
    abandon_open_attempts(attempt.job_id, cause=describe(fact), kind=fact.kind)
    decision = outcomes.outcome(fact.kind, stopping=False, reclaimed=False, exit_code=None, failover_on=attempt.job.failover_enabled)
    transition(attempt.job_id, decision.status, reason=decision.reason.format(detail=error), actor=AGENT, attempt=attempt.number)


def max_run_time_reached(job: TrainingJob) -> None:
    """The run has been Running for longer than the job allows: ask it to stop."""
    transition(job.pk, JobStatus.STOPPING, reason=f"max run time of {job.max_run_minutes} min exceeded", actor=AGENT, expected={JobStatus.RUNNING})


def storage_measured(uses: Sequence[StorageUse]) -> list[int]:
    """What the runs of an agent's live jobs use of its nodes' disk (``agent.storage``). Runs over
    the job limit (``JOB_STORAGE_LIMIT_GIB``) or, the largest first, over their project's total
    (``Project.storage_limit_gib``) must end: each gets its end (``EndKind.STORAGE_LIMIT``, the
    console's intent written before the exit) on its attempt, so its end reads as that limit
    (``record_exit``: Failed, never judged by Job Failover), and its stop begins
    (its ranks on other nodes are woken). Returns the attempt ids the agent must end now."""
    projects = {
        pk: (name, (gib or 0) * 2**30)
        for pk, name, gib in Project.objects.filter(pk__in={u.project_id for u in uses}, storage_limit_gib__gt=0).values_list("pk", "name", "storage_limit_gib")
    }
    ending = []
    for attempt_id, verdict in storage_verdicts(list(uses), job_limit=job_storage_limit(), project_limits=projects).items():
        cause = describe(Ended(EndKind.STORAGE_LIMIT, detail=verdict))
        # Only a run still going, and only the first cause: an exit seen meanwhile keeps its own.
        if JobAttempt.objects.filter(pk=attempt_id, state=JobAttempt.State.RUNNING, cause="").update(
            cause=cause[:500], end_kind=EndKind.STORAGE_LIMIT, stop_requested_at=timezone.now()
        ):
            job_id = JobAttempt.objects.values_list("job_id", flat=True).get(pk=attempt_id)
            logger.warning("job %s: attempt %s ends: %s", job_id, attempt_id, cause)
            wake_agents(attempts=[attempt_id])
            ending.append(attempt_id)
    return ending


def run_started(attempt: JobAttempt) -> bool:
    """The attempt's processes have started: the job is Running. False if the job moved on."""
    now = timezone.now()
    job = attempt.job
    fields = {} if job.started_at else {"started_at": now}
    reason = f"attempt {attempt.number} running on {placement_text(attempt)}"
    previous = JobAttempt.objects.filter(job=job, number__lt=attempt.number, state=JobAttempt.State.EXITED).order_by("-number").first()
    evidence: dict = {}
    if previous is not None and (previous.verdict == "hardware" or previous.reclaimed):
        nodes = ", ".join(previous.placements.values_list("node__name", flat=True))
        if previous.evidence.get("source") == "heartbeat" and previous.cause:
            # A lost node, said once: "after node node-a lost (no heartbeat for 90s)".
            reason = f"attempt {attempt.number} on {placement_text(attempt)} after {previous.cause}"
        else:
            what = yield_text(previous) if previous.reclaimed else f"a GPU fault: {previous.verdict_reason}"
            reason = f"attempt {attempt.number} on {placement_text(attempt)} after {what} on {nodes}"
        evidence = {"previous_attempt": previous.number, **previous.evidence}
    if attempt.resume_step is not None and attempt.resume_source == "replica":
        lost = attempt.resume_detail.split(" (", 1)[0] if " lost" in attempt.resume_detail.split(";", 1)[0] else ""
        reason += f"; resuming from the in-memory replica of step {attempt.resume_step}" + (f", {lost}" if lost else "")
    elif attempt.resume_step is not None:
        reason += f"; resuming from checkpoint step {attempt.resume_step}"
    with transaction.atomic():
        # Only a placed attempt starts: one the control plane ended meanwhile (its node taken as
        # lost, or abandoned) stays ended, and its agent ends the stray run (``stop_strays``).
        if not JobAttempt.objects.filter(pk=attempt.pk, state=JobAttempt.State.PLACED).update(state=JobAttempt.State.RUNNING, started_at=now):
            logger.warning("job %s: attempt %s reported its start after it had ended; ignored", job.pk, attempt.number)
            return False
        moved = transition(
            job.pk,
            JobStatus.RUNNING,
            reason=reason,
            actor=AGENT,
            attempt=attempt.number,
            expected={JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF, JobStatus.FAILOVER_IN_PROGRESS},
            evidence=evidence,
            **fields,
        )
        if not moved:
            JobAttempt.objects.filter(pk=attempt.pk).update(stop_requested_at=now)
            wake_agents(attempts=[attempt.pk])
    return moved


def part_exited(part: AttemptNode, fact: Ended) -> list[AttemptNode]:
    """One rank of an attempt ended as ``fact`` says. Returns the ranks still running that must
    now be stopped (a rank failed: the others cannot go on without it); the last rank to end
    closes the attempt."""
    now = timezone.now()
    exit_code, exit_signal = fact.exit_code, fact.exit_signal
    AttemptNode.objects.filter(pk=part.pk, ended_at__isnull=True).update(ended_at=now, exit_code=exit_code, exit_signal=exit_signal)
    attempt = part.attempt
    failed = not fact.plain or exit_signal or (exit_code not in (0, None))
    siblings = AttemptNode.objects.filter(attempt=attempt)
    if not fact.plain:  # the first rank's cause is the attempt's (an out-of-memory kill, a lost supervisor)
        JobAttempt.objects.filter(pk=attempt.pk, cause="").update(cause=describe(fact)[:500], end_kind=fact.kind)
    if siblings.filter(ended_at__isnull=True).exists():
        if failed and attempt.stop_requested_at is None:
            JobAttempt.objects.filter(pk=attempt.pk, stop_requested_at__isnull=True).update(stop_requested_at=now)
            wake_agents(attempts=[attempt.pk])
            return list(siblings.filter(ended_at__isnull=True).select_related("attempt", "node"))
        return []
    # The attempt's outcome: its first cause, else the exit of the first rank that failed, else rank 0's.
    ended = list(siblings.order_by("ended_at", "rank"))
    first_bad = next((p for p in ended if p.exit_signal or p.exit_code not in (0,)), None)
    source = first_bad or ended[0]
    cause, kind = JobAttempt.objects.values_list("cause", "end_kind").get(pk=attempt.pk)
    if not cause:
        record_exit(attempt, exited(source.exit_code, source.exit_signal))
    else:
        close(
            attempt, recorded_kind(kind, cause, source.exit_code, source.exit_signal), exit_code=source.exit_code, exit_signal=source.exit_signal, cause=cause
        )
    return []


def recorded_kind(kind: str, cause: str, exit_code: int | None, exit_signal: int | None) -> EndKind:
    """The end kind stored with an attempt's cause. A cause stored without one (an attempt given
    up before its run started) is taken as given up."""
    if kind:
        return EndKind(kind)
    return EndKind.ABANDONED if cause else exited(exit_code, exit_signal).kind


def finishing(job: TrainingJob, attempt: JobAttempt) -> bool:
    """Whether an attempt already closed still has to move its job: the report that closed it
    failed after the close committed (the database refused the status write), so the job is still
    where the run left it and no later attempt exists. The moves that follow are compare-and-swaps
    (the status, Job Failover's claim), so a second report never moves the job twice."""
    return job.status in (JobStatus.RUNNING, JobStatus.STOPPING) and not JobAttempt.objects.filter(job_id=job.pk, number__gt=attempt.number).exists()


# An attempt closed this long ago whose job has not moved on was left by a report that failed
# (or a process that died) between the two commits; ``finish_closed_attempts`` moves it.
CLOSE_GRACE = timedelta(seconds=20)


def finish_closed_attempts(limit: int = 100) -> int:
    """The control round's sweep for jobs left Running (or Stopping) with their last attempt
    closed: the decision its exit leads to is made again (``record_exit``; its moves are
    compare-and-swaps, so a report still in flight never moves a job twice). One query when there
    is nothing to do. Returns how many were moved on."""
    later = JobAttempt.objects.filter(job_id=OuterRef("job_id"), number__gt=OuterRef("number"))
    stale = (
        JobAttempt.objects.filter(
            state=JobAttempt.State.EXITED,
            ended_at__lt=timezone.now() - CLOSE_GRACE,
            job__status__in=[JobStatus.RUNNING, JobStatus.STOPPING],
        )
        .exclude(Exists(later))
        .order_by("ended_at")[:limit]
    )
    moved = 0
    for attempt in stale:
        # The end given at the close is stored: its kind and its words.
        kind = recorded_kind(attempt.end_kind, attempt.cause, attempt.exit_code, attempt.exit_signal)
        logger.warning("job %s: attempt %s closed but the job did not move on; deciding again", attempt.job_id, attempt.number)
        status = close(attempt, kind, exit_code=attempt.exit_code, exit_signal=attempt.exit_signal, cause=attempt.cause)
        moved += status not in (JobStatus.RUNNING, JobStatus.STOPPING)
    return moved


def record_exit(attempt: JobAttempt, fact: Ended) -> str:
    """The attempt's run ended as ``fact`` says: close it and move its job (``close``)."""
    return close(attempt, fact.kind, exit_code=fact.exit_code, exit_signal=fact.exit_signal, cause=describe(fact))


def close(attempt: JobAttempt, kind: EndKind, *, exit_code: int | None, exit_signal: int | None, cause: str) -> str:
    """Close the attempt (its end: ``kind``, in the words ``cause``), free its GPUs and move the
    job to where the end takes it (``jobs.backends.outcomes``): a job being stopped ends
    ``Stopped``; a reclaimed Spot run goes back to ``Pending``; exit 0 ends ``Completed``; a run
    ended at its own memory, PID or storage limit ends ``Failed``; any other end of a run is judged
    by Job Failover when the job has it on, else ends ``Failed``. Returns the job's new status.
    """
    now = timezone.now()
    with transaction.atomic():
        updated = (
            JobAttempt.objects.filter(pk=attempt.pk)
            .exclude(state=JobAttempt.State.EXITED)
            .update(state=JobAttempt.State.EXITED, ended_at=now, exit_code=exit_code, exit_signal=exit_signal, cause=cause[:500], end_kind=kind)
        )
        if updated:
            release_gpus(attempt)
            request_placement()  # the freed GPUs may fit a waiting job
    job = TrainingJob.objects.get(pk=attempt.job_id)
    if not updated and not finishing(job, attempt):
        return job.status
    attempt.refresh_from_db()
    if job.status not in (JobStatus.STOPPING, JobStatus.RUNNING):
        logger.warning("job %s: attempt %s ended while the job was %s", job.pk, attempt.number, job.status)
        return job.status
    decision = outcomes.outcome(
        kind, stopping=job.status == JobStatus.STOPPING, reclaimed=attempt.reclaimed, exit_code=exit_code, failover_on=job.failover_enabled
    )
    if decision.judge and extensions.failed_run_handler is not None:
        return extensions.failed_run_handler(job, attempt, cause, decision.lost)
    to = JobStatus.FAILED if decision.judge else decision.status  # judged, but no judge is registered
    if decision is outcomes.FAILOVER_OFF and extensions.fault_namer is not None:
        # Killed for a hardware fault: the fault is the cause, not the kill's signal.
        cause = extensions.fault_namer(attempt) or cause
    words = {"cause": cause, "detail": "", "stopped": job.status_reason or "stopped"}
    reason = decision.reason.format(**words, yielded=yield_text(attempt) if "{yielded}" in decision.reason else "")
    transition(job.pk, to, reason=reason, actor=AGENT, attempt=attempt.number, expected={job.status})
    return to
