"""The one writer of a Training Job's status, status reason and failover count.

Every change of those fields goes through ``transition`` (a new status), ``record_reason``
(the same status, a new reason or count) or its bulk forms (``record_queue_reasons``,
``record_placements``: many jobs at once): a compare-and-swap on the
job row, its event row in the same transaction, and a live publish after commit. A test keeps every other module from writing
them. Every change but placement's own wakes the embedded control round after commit
(``jobs.services.wakeups``): an attempt ended, a verdict, a back-off, a stop change what it decides.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from jobs import extensions
from jobs.models import JobEvent, TrainingJob
from jobs.realtime import job_group, jobs_group, publish_many
from jobs.services import wakeups
from jobs.services.bulk import update_each
from jobs.statuses import TERMINAL, sources_of

logger = logging.getLogger(__name__)

REASON_CHARS = 500
# Placement's own records ("placed on …") wake no round: the round that wrote them knows.
PLACEMENT = "placement"


def transition(
    job_id: int,
    to_status: str,
    *,
    reason: str = "",
    actor: str = "system",
    attempt: int | None = None,
    expected: Iterable[str] | None = None,
    evidence: dict | None = None,
    **fields: Any,
) -> bool:
    """Move a job to ``to_status`` if the transition table allows it from its current status.

    The update only matches a row whose status is one the table allows into ``to_status``
    (narrowed to ``expected`` if given). Extra ``fields`` are set in the same update. Returns
    whether the job moved; a concurrent change that got there first makes it return False.
    """
    allowed_from = sources_of(to_status)
    if expected is not None:
        allowed_from = allowed_from & frozenset(expected)
    if to_status in TERMINAL and "finished_at" not in fields:
        fields["finished_at"] = timezone.now()
    return write(job_id, allowed_from, to_status, reason=reason, actor=actor, attempt=attempt, evidence=evidence, fields=fields)


def record_reason(
    job_id: int,
    *,
    reason: str,
    expected: Iterable[str],
    actor: str = "system",
    attempt: int | None = None,
    evidence: dict | None = None,
    event: bool = True,
    **fields: Any,
) -> bool:
    """Keep the job's status (one of ``expected``) and record why it is there now: a waiting
    reason, a placement, a retry, a failover counted (``failover_count=F(...) + 1``).
    ``event=False`` updates the reason in place (published live, no event row, no status hook):
    the same why told again, such as an image-pull retry's count and next time."""
    return write(job_id, frozenset(expected), None, reason=reason, actor=actor, attempt=attempt, evidence=evidence, fields=fields, event=event)


QUEUE_CHUNK = 300


def record_queue_reasons(reasons: dict[int, tuple[str, str]], *, actor: str = PLACEMENT) -> list[int]:
    """A placement round's waiting reasons: job → (its status, the reason with its place in line).

    Written with one ``UPDATE … CASE`` per chunk of jobs, each row only while its status is still
    the one given (compare-and-swap). A change of place alone ("3rd" → "2nd") is written and
    published but makes no event row; a change of why (the part after the first "; ") does.
    Returns the jobs changed."""
    changed: list[int] = []
    by_status: dict[str, list[int]] = {}
    for job_id, (status, _reason) in reasons.items():
        by_status.setdefault(status, []).append(job_id)
    now = timezone.now()
    messages: list[tuple[int, dict]] = []
    with transaction.atomic():
        for status, ids in by_status.items():
            for start in range(0, len(ids), QUEUE_CHUNK):
                chunk = ids[start : start + QUEUE_CHUNK]
                before = dict(TrainingJob.objects.filter(pk__in=chunk, status=status).values_list("pk", "status_reason"))
                fresh = {pk: reasons[pk][1][:REASON_CHARS] for pk in before if before[pk] != reasons[pk][1][:REASON_CHARS]}
                if not fresh:
                    continue
                update_each(TrainingJob, "status_reason", fresh, where={"status": status})
                JobEvent.objects.bulk_create(
                    JobEvent(job_id=pk, from_status=status, to_status=status, reason=r, actor=actor[:150], created_at=now)
                    for pk, r in fresh.items()
                    if r.partition("; ")[2] != before[pk].partition("; ")[2]
                )
                changed += fresh
                messages += [(pk, status_message(pk, status, status, r)) for pk, r in fresh.items()]

        def publish_all() -> None:
            publish_statuses(messages)

        transaction.on_commit(publish_all)
    if changed:
        logger.info("placement: %s waiting reason(s) changed", len(changed))
    return changed


def record_placements(placements: dict[int, tuple[str, str, int]], *, actor: str = PLACEMENT, in_place: Collection[int] = ()) -> list[int]:
    """``record_reason`` for a placement round's jobs at once: job → (the status it was placed
    in, "placed on …", the attempt's number). The jobs in ``in_place`` get their reason written
    without an event row (an image-pull retry: its back-off event already says why it waits).

    One ``UPDATE … CASE`` per status and chunk of jobs, each row only while its status is still
    the one given (compare-and-swap), one read back, one insert of events; live publishes and
    status hooks after commit. Returns the jobs changed: the caller rolls back when some were
    not (they changed since it read them)."""
    by_status: dict[str, list[int]] = {}
    for job_id, (status, _reason, _number) in placements.items():
        by_status.setdefault(status, []).append(job_id)
    now = timezone.now()
    changed: list[int] = []
    with transaction.atomic():
        for status, ids in by_status.items():
            for start in range(0, len(ids), QUEUE_CHUNK):
                reasons = {pk: placements[pk][1][:REASON_CHARS] for pk in ids[start : start + QUEUE_CHUNK]}
                update_each(TrainingJob, "status_reason", reasons, where={"status": status})
                # The update holds the rows it changed until commit: read back, they are exactly those.
                after = TrainingJob.objects.filter(pk__in=list(reasons), status=status).values_list("pk", "status_reason")
                changed += [pk for pk, reason in after if reason == reasons[pk]]
        events = JobEvent.objects.bulk_create(
            JobEvent(
                job_id=pk,
                from_status=placements[pk][0],
                to_status=placements[pk][0],
                reason=placements[pk][1][:REASON_CHARS],
                attempt=placements[pk][2],
                actor=actor[:150],
                created_at=now,
            )
            for pk in changed
            if pk not in in_place
        )
        changes = [extensions.StatusChange(e.pk, e.job_id, e.from_status, e.to_status, e.reason, e.attempt) for e in events]
        quiet = [(pk, placements[pk][0], placements[pk][1][:REASON_CHARS]) for pk in changed if pk in in_place]

        def publish_all() -> None:
            publish_statuses(
                [(c.job_id, status_message(c.job_id, c.from_status, c.to_status, c.reason)) for c in changes]
                + [(pk, status_message(pk, status, status, reason)) for pk, status, reason in quiet]
            )
            for change in changes:
                extensions.status_changed(change)

        transaction.on_commit(publish_all)
    return changed


def write(
    job_id: int,
    allowed_from: frozenset[str],
    to_status: str | None,
    *,
    reason: str,
    actor: str,
    attempt: int | None,
    evidence: dict | None,
    fields: dict[str, Any],
    event: bool = True,
) -> bool:
    """Compare-and-swap the job row from one of ``allowed_from`` (to ``to_status``, or staying
    where it is when None), write the event row (unless ``event`` is False, for a reason updated
    in place without a new status), publish after commit."""
    reason = reason[:REASON_CHARS]
    with transaction.atomic():
        from_status = TrainingJob.objects.filter(pk=job_id, status__in=allowed_from).values_list("status", flat=True).first()
        if from_status is None:
            return False
        new_status = to_status or from_status
        updates = {"status": new_status, "status_reason": reason, **fields}
        if TrainingJob.objects.filter(pk=job_id, status=from_status).update(**updates) != 1:
            return False
        message = status_message(job_id, from_status, new_status, reason)
        transaction.on_commit(lambda: publish_status(job_id, message))
        if actor != PLACEMENT:
            wakeups.round_wanted()
        if not event:
            logger.debug("job %s: %s (%s), in place", job_id, from_status, reason)
            return True
        row = JobEvent.objects.create(
            job_id=job_id,
            from_status=from_status,
            to_status=new_status,
            reason=reason,
            attempt=attempt,
            actor=actor[:150],
            evidence=evidence or {},
            created_at=timezone.now(),
        )
        change = extensions.StatusChange(row.pk, job_id, from_status, new_status, reason, attempt)
        transaction.on_commit(lambda: extensions.status_changed(change))
    logger.info("job %s: %s → %s (%s)", job_id, from_status, new_status, reason or "no reason given")
    return True


def status_message(job_id: int, from_status: str, to_status: str, reason: str) -> dict:
    return {"type": "job.status", "job": job_id, "from": from_status, "status": to_status, "reason": reason}


def publish_status(job_id: int, message: dict) -> None:
    publish_statuses([(job_id, message)])


def publish_statuses(messages: list[tuple[int, dict]]) -> None:
    """Each job's status message to its page's group and to the lists' group, in one hand-over."""
    publish_many([(group, message) for job_id, message in messages for group in (job_group(job_id), jobs_group())])


def record_creation(job: TrainingJob, *, actor: str) -> None:
    JobEvent.objects.create(job=job, from_status="", to_status=job.status, reason="job created", actor=actor[:150])
    # Open lists show the new job: the same message as a status change, from no status.
    message = status_message(job.pk, "", job.status, "job created")
    transaction.on_commit(lambda: publish_status(job.pk, message))
    wakeups.round_wanted()  # placed within the second, not at the safety sweep
    logger.info("job %s: created as %s", job.pk, job.status)
