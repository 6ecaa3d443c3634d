"""Celery tasks of notifications (scale-out): fan an event out to its deliveries, send one,
retry with backoff by re-queuing it with a countdown; mail a confirmation link."""

from __future__ import annotations

from celery import shared_task

from notify import services, verification


@shared_task(name="notify.fan_out", ignore_result=True, acks_late=False)
def fan_out(event_id: int) -> None:
    for delivery_id in services.fan_out(event_id):
        deliver.delay(delivery_id)


@shared_task(name="notify.deliver", ignore_result=True, acks_late=False)
def deliver(delivery_id: int) -> None:
    delay = services.deliver(delivery_id)
    if delay is not None:
        deliver.apply_async((delivery_id,), countdown=delay)


@shared_task(name="notify.send_verification", ignore_result=True, acks_late=False)
def send_verification(subscription_id: int) -> None:
    verification.send(subscription_id)
