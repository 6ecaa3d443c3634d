"""From a committed status change to the delivery machinery, without blocking the writer: the
event id goes to Celery in scale-out (tasks ``notify.fan_out`` and ``notify.deliver``), or to
the embedded worker thread otherwise."""
from __future__ import annotations

import logging

from django.conf import settings

from jobs.hooks import StatusChange
from notify.services import kinds_of

logger = logging.getLogger(__name__)


def status_changed(change: StatusChange) -> None:
    if not kinds_of(change.from_status, change.to_status):
        return
    if settings.SCALE_OUT:
        from notify.tasks import fan_out

        try:
            fan_out.delay(change.event_id)
        except Exception:  # the broker is down: the event row stays; nothing else may fail
            logger.exception("could not queue notifications for event %s", change.event_id)
        return
    from notify.worker import worker

    worker.submit("fan_out", change.event_id)
