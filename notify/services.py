"""Which status changes notify whom, and sending one delivery (a webhook POST or an e-mail).

``fan_out(event_id)`` makes one ``Delivery`` per matching subscription (the unique pair
subscription × event keeps a second fan-out of the same event from adding any);
``deliver(delivery_id)`` claims a due delivery by compare-and-swap, sends it once and records the
outcome, returning the seconds until its retry (or None). Nothing here runs on a request's path:
``notify.dispatch`` hands both to the embedded worker or to Celery.
"""
from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import logging
import socket
import time
import urllib.error
import urllib.request
from datetime import timedelta
from urllib.parse import urlsplit

from django.conf import settings
from django.core.mail import send_mail
from django.db.models import F, Q
from django.utils import timezone

from jobs.models import JobEvent, TrainingJob
from jobs.statuses import TERMINAL, JobStatus
from notify.models import Delivery, Kind, Subscription

logger = logging.getLogger(__name__)

# When an event is several kinds at once, the one named in its payload and subject.
KIND_ORDER = [Kind.INTERNAL_ERROR, Kind.PREEMPTION, Kind.FAILOVER, Kind.TERMINAL]


def kinds_of(from_status: str, to_status: str) -> set[str]:
    """The kinds of notification a change is (none for a new reason of the same status)."""
    if not from_status or from_status == to_status:
        return set()
    kinds = set()
    if to_status in TERMINAL:
        kinds.add(Kind.TERMINAL.value)
    if to_status == JobStatus.INTERNAL_ERROR:
        kinds.add(Kind.INTERNAL_ERROR.value)
    if to_status == JobStatus.FAILOVER_IN_PROGRESS:
        kinds.add(Kind.FAILOVER.value)
    if from_status == JobStatus.RUNNING and to_status == JobStatus.PENDING:
        kinds.add(Kind.PREEMPTION.value)
    return kinds


def primary_kind(kinds: set[str]) -> str:
    return next(k.value for k in KIND_ORDER if k.value in kinds)


def fan_out(event_id: int) -> list[int]:
    """Make the deliveries of one event; returns the ids of those still to send."""
    event = JobEvent.objects.select_related("job").filter(pk=event_id).first()
    if event is None:
        return []
    kinds = kinds_of(event.from_status, event.to_status)
    if not kinds:
        return []
    job = event.job
    candidates = Subscription.objects.filter(active=True).filter(
        Q(job_id=job.pk) | Q(project_id=job.project_id, job__isnull=True) | Q(job__isnull=True, project__isnull=True, user_id=job.owner_id)
    ).select_related("user")
    chosen = [
        s for s in candidates
        if kinds & set(s.kinds) and s.user.is_active and TrainingJob.objects.visible_to(s.user).filter(pk=job.pk).exists()
    ]
    kind = primary_kind(kinds)
    Delivery.objects.bulk_create(
        [Delivery(subscription=s, event=event, kind=kind, next_try_at=timezone.now()) for s in chosen], ignore_conflicts=True
    )
    return list(Delivery.objects.filter(event=event, state=Delivery.State.PENDING).values_list("pk", flat=True))


def due_deliveries() -> list[tuple[int, float]]:
    """Deliveries waiting to be sent (after a restart): (id, seconds until due)."""
    now = timezone.now()
    rows = Delivery.objects.filter(state=Delivery.State.PENDING).values_list("pk", "next_try_at")
    return [(pk, max((due - now).total_seconds(), 0.0)) for pk, due in rows]


class DeliveryError(Exception):
    def __init__(self, message: str, status: int | None = None, *, final: bool = False) -> None:
        super().__init__(message)
        self.http_status = status
        self.final = final  # retrying cannot help (a refused destination)


def deliver(delivery_id: int) -> float | None:
    """Send one due delivery once. Returns the seconds until it should be tried again, or None
    (delivered, given up, or not this caller's to send)."""
    now = timezone.now()
    claimed = Delivery.objects.filter(pk=delivery_id, state=Delivery.State.PENDING, next_try_at__lte=now).update(
        state=Delivery.State.SENDING, attempts=F("attempts") + 1
    )
    if not claimed:
        # Woken a little early (clocks differ): say when it is due. Anything else is done or
        # another worker's.
        due = Delivery.objects.filter(pk=delivery_id, state=Delivery.State.PENDING).values_list("next_try_at", flat=True).first()
        return None if due is None else max((due - now).total_seconds(), 0.05)
    delivery = Delivery.objects.select_related("subscription__user", "event__job__owner", "event__job__project").get(pk=delivery_id)
    try:
        try:
            status = send(delivery)
        except DeliveryError:
            raise
        except Exception as exc:  # a bug or a broken row: logged, and counted as a failed try
            logger.exception("delivery %s could not be sent", delivery_id)
            raise DeliveryError(f"not sent: {type(exc).__name__}") from None
    except DeliveryError as exc:
        error = str(exc)[:500]
        if exc.final or delivery.attempts >= settings.NOTIFY_MAX_ATTEMPTS:
            Delivery.objects.filter(pk=delivery_id).update(state=Delivery.State.FAILED, last_status=exc.http_status, last_error=error)
            logger.warning("delivery %s failed for good after %s tries: %s", delivery_id, delivery.attempts, error)
            return None
        delay = settings.NOTIFY_RETRY_BASE * 2 ** (delivery.attempts - 1)
        Delivery.objects.filter(pk=delivery_id).update(
            state=Delivery.State.PENDING, last_status=exc.http_status, last_error=error, next_try_at=timezone.now() + timedelta(seconds=delay)
        )
        logger.info("delivery %s try %s failed (%s); again in %.0f s", delivery_id, delivery.attempts, error, delay)
        return delay
    Delivery.objects.filter(pk=delivery_id).update(state=Delivery.State.DELIVERED, last_status=status, last_error="", delivered_at=timezone.now())
    return None


def send(delivery: Delivery) -> int | None:
    subscription = delivery.subscription
    if subscription.channel == Subscription.Channel.EMAIL:
        subject, body = email_text(delivery)
        try:
            send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [subscription.email], fail_silently=False)
        except Exception as exc:  # SMTP and socket errors alike: retried
            raise DeliveryError(f"mail not sent: {exc}") from None
        return None
    return post_webhook(subscription, payload(delivery))


def job_url(job: TrainingJob) -> str:
    return f"{settings.NOTIFY_LINK_BASE}/training-jobs/{job.pk}/"


def event_body(delivery: Delivery) -> dict:
    """The JSON body of a delivery: the event, its job and where to see it."""
    event, job = delivery.event, delivery.event.job
    return {
        "id": f"evt_{event.pk}",
        "event_id": event.pk,
        "delivery_id": delivery.pk,
        "kind": delivery.kind,
        "job": {"id": job.pk, "name": job.name, "owner": job.owner.username, "project": job.project.name if job.project_id else None, "url": job_url(job)},
        "from_status": event.from_status,
        "status": event.to_status,
        "reason": event.reason,
        "attempt": event.attempt,
        "failover_count": job.failover_count,
        "created_at": event.created_at.isoformat(),
    }


def payload(delivery: Delivery) -> dict:
    """What a webhook gets: the event body, or with the Slack option ``{"text": …}``."""
    body = event_body(delivery)
    return {"text": slack_text(body)} if delivery.subscription.slack else body


def headline(body: dict) -> str:
    return f"Job {body['job']['name']} ({body['job']['id']}): {body['from_status']} → {body['status']}"


def slack_text(body: dict) -> str:
    return f"*{headline(body)}*\n{body['reason']}\n<{body['job']['url']}|Open the job>"


def email_text(delivery: Delivery) -> tuple[str, str]:
    body = event_body(delivery)
    text = f"{headline(body)}\n\nReason: {body['reason'] or '-'}\nAttempt: {body['attempt'] or '-'}\n\n{body['job']['url']}\n"
    return f"[satrain] {headline(body)}", text


def sign(secret: str, timestamp: int, body: bytes) -> str:
    """``t=<unix time>,sha256=<hex HMAC-SHA256 of "<t>." + body with the subscription's secret>``."""
    digest = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},sha256={digest}"


class NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):  # a redirect is an answer, not followed
        return None


OPENER = urllib.request.build_opener(NoRedirects)


def check_destination(url: str) -> None:
    """Refuse webhook hosts that resolve to link-local addresses (cloud metadata services) or to
    unspecified, multicast or reserved ones, and — unless NOTIFY_WEBHOOK_ALLOW_PRIVATE —
    to loopback and private networks."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeliveryError("not an http(s) URL", final=True)
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or (443 if parts.scheme == "https" else 80), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise DeliveryError(f"cannot resolve {parts.hostname}: {exc}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if address.is_link_local or address.is_multicast or address.is_unspecified or address.is_reserved:
            raise DeliveryError(f"refused: {parts.hostname} is {address}, a link-local or reserved address", final=True)
        if (address.is_loopback or address.is_private) and not settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE:
            raise DeliveryError(f"refused: {parts.hostname} is {address}, a private address (NOTIFY_WEBHOOK_ALLOW_PRIVATE is off)", final=True)


def post_webhook(subscription: Subscription, body: dict) -> int:
    check_destination(subscription.url)
    data = json.dumps(body).encode()
    request = urllib.request.Request(subscription.url, data=data, method="POST")
    request.add_header("Content-Type", "application/json")
    request.add_header("User-Agent", "satrain-notify/1")
    request.add_header("X-Satrain-Event", body.get("kind", "slack"))
    if "event_id" in body:
        request.add_header("X-Satrain-Event-Id", str(body["event_id"]))
    request.add_header("X-Satrain-Signature", sign(subscription.secret, int(time.time()), data))
    try:
        with OPENER.open(request, timeout=settings.NOTIFY_TIMEOUT) as response:
            response.read(65536)
            return response.status
    except urllib.error.HTTPError as exc:
        raise DeliveryError(f"HTTP {exc.code} from the endpoint", exc.code) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise DeliveryError(f"no answer: {getattr(exc, 'reason', exc)}") from None
