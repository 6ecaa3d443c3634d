"""Confirming an e-mail address before anything is sent to it.

A new e-mail subscription (or one whose address changes) is unverified: its deliveries are
skipped. One e-mail with a signed link (``django.core.signing``, valid ``NOTIFY_EMAIL_VERIFY_DAYS``)
goes to the address; opening it marks that user's subscriptions to that address verified. The
order: ``refusal`` (at most ``NOTIFY_VERIFICATION_EMAILS_PER_DAY`` links per user, one a minute
per subscription) → ``record_request`` (``notify.handoff.confirmation_requested`` calls it, then
after commit has the worker or Celery call ``send``) → ``confirm`` (the link).
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.core import signing
from django.core.cache import cache
from django.core.mail import send_mail
from django.urls import reverse
from django.utils import timezone

from notify.models import Subscription

logger = logging.getLogger(__name__)

SALT = "notify.verify-email"
RESEND_AFTER = timedelta(minutes=1)
DAY = 24 * 3600


def _sent_today_key(user_id: int) -> str:
    return f"notify-verification-mails:{user_id}"


def already_verified(user_id: int, email: str, *, besides: int | None = None) -> bool:
    """Another subscription of the user already reaches this address with its holder's consent."""
    return (
        Subscription.objects.filter(user_id=user_id, channel=Subscription.Channel.EMAIL, email__iexact=email, email_verified_at__isnull=False)
        .exclude(pk=besides or 0)
        .exists()
    )


def refusal(user_id: int, subscription: Subscription | None = None) -> str | None:
    """Why no confirmation link may be sent now (None: it may)."""
    if cache.get(_sent_today_key(user_id), 0) >= settings.NOTIFY_VERIFICATION_EMAILS_PER_DAY:
        return f"You have asked for {settings.NOTIFY_VERIFICATION_EMAILS_PER_DAY} confirmation e-mails in the last day, the most allowed: try again tomorrow."
    sent = subscription.verification_sent_at if subscription is not None else None
    if sent is not None and timezone.now() - sent < RESEND_AFTER:
        return "A confirmation link was sent less than a minute ago: check the mailbox (and its spam folder) first."
    return None


def record_request(subscription: Subscription) -> bool:
    """Mark the subscription's address as waiting for confirmation; whether a link must be mailed
    (False: not an e-mail subscription, or an address the user already confirmed, now verified)."""
    if subscription.channel != Subscription.Channel.EMAIL:
        return False
    now = timezone.now()
    if already_verified(subscription.user_id, subscription.email, besides=subscription.pk):
        Subscription.objects.filter(pk=subscription.pk).update(email_verified_at=now)
        subscription.email_verified_at = now
        return False
    Subscription.objects.filter(pk=subscription.pk).update(email_verified_at=None, verification_sent_at=now)
    subscription.email_verified_at, subscription.verification_sent_at = None, now
    key = _sent_today_key(subscription.user_id)
    if not cache.add(key, 1, timeout=DAY):
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, timeout=DAY)
    return True


def token_for(subscription: Subscription) -> str:
    return signing.dumps({"s": subscription.pk, "e": subscription.email}, salt=SALT, compress=True)


def link_for(subscription: Subscription) -> str:
    return settings.NOTIFY_LINK_BASE + reverse("notify:verify", args=[token_for(subscription)])


def send(subscription_id: int) -> None:
    """Mail one confirmation link, if the subscription still waits for one."""
    subscription = Subscription.objects.select_related("user").filter(pk=subscription_id).first()
    if subscription is None or not subscription.awaiting_verification:
        return
    days = settings.NOTIFY_EMAIL_VERIFY_DAYS
    body = (
        f"{subscription.user.get_username()} asked the training console to send notifications of their jobs "
        f"({subscription.scope}) to this address.\n\n"
        f"To agree, open this link within {days:g} days:\n{link_for(subscription)}\n\n"
        "If you did not expect this, ignore this e-mail: nothing will be sent to you.\n"
    )
    try:
        send_mail("[satrain] Confirm notifications to this address", body, settings.DEFAULT_FROM_EMAIL, [subscription.email])
    except Exception:  # SMTP and socket errors alike: the user can ask for the link again
        logger.exception("confirmation e-mail for subscription %s not sent", subscription_id)
        return
    logger.info("confirmation link for subscription %s sent", subscription_id)


def confirm(token: str) -> Subscription | None:
    """The subscription a link confirms, now verified with every subscription of its user to the
    same address; None for a link that is forged, expired, or for an address since changed."""
    try:
        claim = signing.loads(token, salt=SALT, max_age=timedelta(days=settings.NOTIFY_EMAIL_VERIFY_DAYS))
    except signing.BadSignature:  # SignatureExpired included
        return None
    if not isinstance(claim, dict) or not isinstance(claim.get("s"), int) or not isinstance(claim.get("e"), str):
        return None
    subscription = Subscription.objects.filter(pk=claim["s"], channel=Subscription.Channel.EMAIL, email=claim["e"]).first()
    if subscription is None:
        return None
    Subscription.objects.filter(
        user_id=subscription.user_id, channel=Subscription.Channel.EMAIL, email__iexact=subscription.email, email_verified_at__isnull=True
    ).update(email_verified_at=timezone.now())
    subscription.refresh_from_db()
    logger.info("subscription %s: %s verified", subscription.pk, subscription.email)
    return subscription
