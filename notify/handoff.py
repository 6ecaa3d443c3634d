"""From a committed status change to the delivery machinery, without blocking the writer: the
event id goes to Celery in scale-out (tasks ``notify.fan_out`` and ``notify.deliver``), or to
the embedded worker thread otherwise. A confirmation link to mail (``notify.verification``) takes
the same way (task ``notify.send_verification``)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

from jobs.extensions import StatusChange
from notify import verification
from notify.models import Subscription
from notify.services import kinds_of
from notify.tasks import fan_out, send_verification
from notify.worker import worker

logger = logging.getLogger(__name__)


def status_changed(change: StatusChange) -> None:
    if not kinds_of(change.from_status, change.to_status):
        return
    if not Subscription.objects.exists():
        return  # nobody listens: no message, no thread (one indexed query on the caller's connection)
    if settings.SCALE_OUT:
        try:
            fan_out.delay(change.event_id)
        except Exception:  # the broker is down: the event row stays; nothing else may fail
            logger.exception("could not queue notifications for event %s", change.event_id)
        return

    worker.submit("fan_out", change.event_id)


def confirmation_requested(subscription: Subscription) -> None:
    """An e-mail subscription was made or its address changed: unless the user already confirmed
    that address, mark it unconfirmed and, after commit, mail it one link (never on the request's
    path)."""
    if verification.record_request(subscription):
        transaction.on_commit(lambda: send_confirmation(subscription.pk))


def send_confirmation(subscription_id: int) -> None:
    if settings.SCALE_OUT:
        try:
            send_verification.delay(subscription_id)
        except Exception:  # the broker is down: the user can ask for the link again
            logger.exception("could not queue the confirmation e-mail of subscription %s", subscription_id)
        return

    worker.submit("verify", subscription_id)
