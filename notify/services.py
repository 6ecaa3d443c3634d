"""Which status changes notify whom, and sending one delivery (a webhook POST or an e-mail).

``fan_out(event_id)`` makes one ``Delivery`` per matching subscription (the unique pair
subscription × event keeps a second fan-out of the same event from adding any);
``deliver(delivery_id)`` claims a due delivery by compare-and-swap, sends it once and records the
outcome, returning the seconds until its retry (or None). Nothing here runs on a request's path:
``notify.handoff`` hands both to the embedded worker or to Celery.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import logging
import socket
import time
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
    candidates = (
        Subscription.objects.filter(active=True)
        .filter(Q(job_id=job.pk) | Q(project_id=job.project_id, job__isnull=True) | Q(job__isnull=True, project__isnull=True, user_id=job.owner_id))
        .select_related("user")
    )
    chosen = [s for s in candidates if kinds & set(s.kinds) and s.user.is_active and TrainingJob.objects.visible_to(s.user).filter(pk=job.pk).exists()]
    kind = primary_kind(kinds)
    Delivery.objects.bulk_create(
        [Delivery(subscription=s, event=event, kind=kind, next_try_at=timezone.now(), **skipped_fields(s)) for s in chosen],
        ignore_conflicts=True,
    )
    return list(Delivery.objects.filter(event=event, state=Delivery.State.PENDING).values_list("pk", flat=True))


UNVERIFIED = "not sent: the e-mail address has not been confirmed (its confirmation link was not opened)"


def skipped_fields(subscription: Subscription) -> dict:
    """A delivery to an address nobody confirmed is recorded, as skipped, and never sent."""
    return {"state": Delivery.State.SKIPPED, "last_error": UNVERIFIED} if subscription.awaiting_verification else {}


def subscriptions_left(user_id: int) -> int:
    """How many more subscriptions the user may make (``NOTIFY_MAX_SUBSCRIPTIONS_PER_USER``)."""
    return settings.NOTIFY_MAX_SUBSCRIPTIONS_PER_USER - Subscription.objects.filter(user_id=user_id).count()


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
    if delivery.subscription.awaiting_verification:  # the address changed since the fan-out
        Delivery.objects.filter(pk=delivery_id).update(**skipped_fields(delivery.subscription))
        return None
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


def _refusal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> tuple[str, bool] | None:
    """What kind of address a webhook may not go to, and whether NOTIFY_WEBHOOK_ALLOW_PRIVATE
    can allow it; None for a global address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1 is loopback, which ipaddress does not say
    if address.is_loopback:  # before is_reserved: ::1 lies in the reserved ::/8
        return "a loopback or private address (NOTIFY_WEBHOOK_ALLOW_PRIVATE is off)", True
    if address.is_link_local or address.is_multicast or address.is_unspecified or address.is_reserved:
        return "a link-local, multicast, unspecified or reserved address", False
    if not address.is_global:
        return "a loopback or private address (NOTIFY_WEBHOOK_ALLOW_PRIVATE is off)", True
    return None


def check_destination(url: str) -> list[str]:
    """The addresses a webhook may be sent to: every address its host resolves to, each checked.

    Refused (``DeliveryError`` with ``final``): anything but http(s), any address that is
    link-local (cloud metadata services), multicast, unspecified or reserved, and — unless
    NOTIFY_WEBHOOK_ALLOW_PRIVATE — loopback, private and other non-global ones. One bad address
    refuses the host: a name that resolves to both would otherwise be a coin toss.
    """
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        raise DeliveryError("the URL's port is not a number from 0 to 65535", final=True) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DeliveryError("not an http(s) URL", final=True)
    try:
        infos = socket.getaddrinfo(parts.hostname, port or (443 if parts.scheme == "https" else 80), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        raise DeliveryError(f"cannot resolve {parts.hostname}: {exc}") from None
    addresses = []
    for info in infos:
        text = str(info[4][0]).split("%")[0]
        why = _refusal(ipaddress.ip_address(text))
        if why is not None and not (why[1] and settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE):
            where = text if parts.hostname == text else f"{parts.hostname} resolves to {text},"
            raise DeliveryError(f"refused: {where} is {why[0]}", final=True)
        if text not in addresses:
            addresses.append(text)
    if not addresses:
        raise DeliveryError(f"cannot resolve {parts.hostname}: no address")
    return addresses


def destination_refusal(url: str) -> str | None:
    """Why a webhook URL cannot be subscribed to (None: it can), checked as each delivery is."""
    try:
        check_destination(url)
    except DeliveryError as exc:
        return f"This URL cannot receive webhooks: {str(exc).removeprefix('refused: ')}."
    return None


def pinned_connection(url: str, addresses: list[str]) -> http.client.HTTPConnection:
    """An HTTP(S) connection to the URL's host that connects only to ``addresses``, the ones just
    checked: resolving the name again could answer otherwise (DNS rebinding). TLS still checks
    the certificate against the host name."""
    parts = urlsplit(url)
    kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    connection = kind(parts.hostname or "", parts.port, timeout=settings.NOTIFY_TIMEOUT)
    port = parts.port or connection.default_port

    def connect_checked(_address, timeout=None, source_address=None):  # socket.create_connection's signature
        error: OSError = OSError(f"no address for {parts.hostname}")
        for address in addresses:
            try:
                return socket.create_connection((address, port), timeout, source_address)
            except OSError as exc:
                error = exc
        raise error

    # http.client connects through this attribute (HTTPS wraps the socket it returns).
    connection._create_connection = connect_checked  # type: ignore[attr-defined]
    return connection


def post_webhook(subscription: Subscription, body: dict) -> int:
    addresses = check_destination(subscription.url)
    data = json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "satrain-notify/1",
        "X-Satrain-Event": body.get("kind", "slack"),
        "X-Satrain-Signature": sign(subscription.secret, int(time.time()), data),
    }
    if "event_id" in body:
        headers["X-Satrain-Event-Id"] = str(body["event_id"])
    parts = urlsplit(subscription.url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    connection = pinned_connection(subscription.url, addresses)
    try:
        connection.request("POST", target, body=data, headers=headers)
        response = connection.getresponse()
        response.read(65536)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise DeliveryError(f"no answer: {exc or type(exc).__name__}") from None
    finally:
        connection.close()
    if not 200 <= response.status < 300:  # a redirect is an answer, not followed
        raise DeliveryError(f"HTTP {response.status} from the endpoint", response.status)
    return response.status
