"""Notifications in-process: which changes notify whom, one delivery per subscription and event,
e-mail through Django's mail, the API's rules and the account page."""

from __future__ import annotations

import pytest
from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus
from notify import services
from notify.models import Delivery, Subscription
from notify.worker import worker

S = JobStatus


@pytest.mark.parametrize(
    "change, kinds",
    [
        ((S.RUNNING, S.COMPLETED), {"terminal"}),
        ((S.RUNNING, S.FAILED), {"terminal"}),
        ((S.STOPPING, S.STOPPED), {"terminal"}),
        ((S.RUNNING, S.FAILOVER_IN_PROGRESS), {"failover"}),
        ((S.FAILOVER_IN_PROGRESS, S.INTERNAL_ERROR), {"terminal", "internalerror"}),
        ((S.FAILOVER_IN_PROGRESS, S.MAX_RETRIES_EXCEEDED), {"terminal"}),
        ((S.RUNNING, S.PENDING), {"preemption"}),
        ((S.PENDING, S.RUNNING), set()),
        ((S.PENDING, S.PENDING), set()),
        (("", S.PENDING), set()),
    ],
)
def test_which_changes_notify(change, kinds):
    assert services.kinds_of(*change) == kinds


def run_to(job, *statuses):
    for status in statuses:
        assert transition(job.pk, status, reason=f"to {status}")


@pytest.mark.django_db(transaction=True)
def test_an_event_is_delivered_once_per_subscription_by_email(make_job, owner, outsider, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    job = make_job()
    confirmed = {"email_verified_at": timezone.now()}
    mine = Subscription.objects.create(user=owner, channel="email", email="owner@example.org", **confirmed)
    Subscription.objects.create(user=owner, channel="email", email="only-failover@example.org", kinds=["failover"], **confirmed)
    # Someone else's subscription to "all my jobs" never covers the owner's job.
    Subscription.objects.create(user=outsider, channel="email", email="outsider@example.org", **confirmed)
    run_to(job, S.RUNNING, S.COMPLETED)
    assert worker.idle()
    event = job.events.get(to_status=S.COMPLETED)
    assert list(Delivery.objects.values_list("subscription_id", "event_id", "state")) == [(mine.pk, event.pk, "delivered")]
    assert [m.to for m in mail.outbox] == [["owner@example.org"]]
    assert "Running → Completed" in mail.outbox[0].subject and f"/training-jobs/{job.pk}/" in mail.outbox[0].body
    # A second fan-out of the same event (a redelivered task) sends nothing more.
    assert services.fan_out(event.pk) == []
    assert len(mail.outbox) == 1


@pytest.mark.django_db(transaction=True)
def test_a_lost_project_membership_stops_project_notifications(make_job, owner, teammate, settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    job = make_job()
    Subscription.objects.create(user=teammate, channel="email", email="mate@example.org", project=job.project, email_verified_at=timezone.now())
    job.project.members.remove(teammate)
    run_to(job, S.RUNNING, S.FAILOVER_IN_PROGRESS)
    assert worker.idle()
    assert mail.outbox == [] and not Delivery.objects.exists()


@pytest.mark.django_db
def test_the_api_keeps_subscriptions_to_what_the_user_may_see(make_job, owner, outsider, settings):
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = True  # the hooks below are on 127.0.0.1
    job = make_job()
    api = APIClient()
    api.force_authenticate(outsider)
    url = "/api/v1/notifications/subscriptions/"
    answer = api.post(url, {"channel": "webhook", "url": "http://127.0.0.1:9/hook", "job": job.pk}, format="json")
    assert answer.status_code == 400 and answer.json() == {"job": ["No such training job, or you may not see it."]}
    answer = api.post(url, {"channel": "webhook", "url": "ftp://example.org/x"}, format="json")
    assert answer.status_code == 400 and "http://" in answer.json()["url"][0]
    answer = api.post(url, {"channel": "email"}, format="json")
    assert answer.json() == {"email": ["An e-mail subscription needs an address."]}
    answer = api.post(url, {"channel": "webhook", "url": "http://127.0.0.1:9/hook", "kinds": ["terminal", "bogus"]}, format="json")
    assert answer.status_code == 400 and "kinds" in answer.json()

    api.force_authenticate(owner)
    answer = api.post(url, {"channel": "webhook", "url": "http://127.0.0.1:9/hook", "job": job.pk, "kinds": ["terminal"], "slack": True}, format="json")
    assert answer.status_code == 201, answer.json()
    created = answer.json()
    assert created["scope"] == f"job {job.pk}" and created["kinds"] == ["terminal"] and len(created["secret"]) >= 40
    assert api.get(f"{url}{created['id']}/deliveries/").json() == []
    api.force_authenticate(outsider)
    assert api.get(url).json() == []
    assert api.delete(f"{url}{created['id']}/").status_code == 404
    assert api.get(f"{url}abc/").status_code == 404


@pytest.mark.django_db
def test_the_account_page_adds_lists_and_deletes_subscriptions(client, owner):
    client.force_login(owner)
    page = client.get("/account/notifications/")
    assert page.status_code == 200 and b"No subscriptions yet." in page.content
    assert b'href="/account/notifications/"' in page.content  # in the account menu
    bad = client.post("/account/notifications/", {"channel": "webhook", "url": "", "scope": "mine"})
    assert bad.status_code == 200 and b"A webhook needs an http:// or https:// URL." in bad.content
    done = client.post(
        "/account/notifications/", {"channel": "email", "email": "me@example.org", "scope": "mine", "kinds": ["terminal", "failover"]}, follow=True
    )
    assert b"me@example.org" in done.content and b"all my jobs" in done.content
    sub = Subscription.objects.get(user=owner)
    assert sorted(sub.kinds) == ["failover", "terminal"]
    client.post("/account/notifications/", {"delete": str(sub.pk)})
    assert not Subscription.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_webhooks_to_link_local_or_forbidden_private_addresses_fail_at_once(make_job, owner, settings):
    job = make_job()
    metadata = Subscription.objects.create(user=owner, channel="webhook", url="http://169.254.169.254/latest/meta-data/")
    run_to(job, S.RUNNING, S.COMPLETED)
    assert worker.idle()
    delivery = Delivery.objects.get(subscription=metadata)
    assert (delivery.state, delivery.attempts) == ("failed", 1)
    assert "link-local" in delivery.last_error

    assert settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE is False  # the default
    with pytest.raises(services.DeliveryError, match="private address") as refused:
        services.check_destination("http://127.0.0.1:9/hook")
    assert refused.value.final
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = True
    services.check_destination("http://127.0.0.1:9/hook")


@pytest.mark.django_db(transaction=True)
def test_in_scale_out_the_celery_tasks_deliver_on_their_own_queue(make_job, owner, settings):
    from console.celery import app

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    settings.SCALE_OUT = True
    for task in ("notify.fan_out", "notify.deliver"):
        assert app.amqp.router.route({}, task)["queue"].name == "notify"
    job = make_job()
    Subscription.objects.create(user=owner, channel="email", email="owner@example.org", kinds=["terminal"], email_verified_at=timezone.now())
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        run_to(job, S.RUNNING, S.COMPLETED)
    finally:
        app.conf.task_always_eager = eager
    assert [m.to for m in mail.outbox] == [["owner@example.org"]]
    assert Delivery.objects.get().state == "delivered"
