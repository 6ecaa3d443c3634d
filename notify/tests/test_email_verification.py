"""Nothing is mailed to an address before its holder confirms it: subscribing sends one e-mail
with a signed, expiring link; until it is opened the deliveries are recorded as skipped and the
page says "waiting for verification"; a changed address needs its own link."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
import time_machine
from django.core import mail
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus
from notify.models import Delivery, Subscription
from notify.worker import worker

SUBSCRIPTIONS = "/api/v1/notifications/subscriptions/"
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def outbox(settings):
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    return mail.outbox


def api_as(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def subscribe(user, email: str, **fields) -> dict:
    answer = api_as(user).post(SUBSCRIPTIONS, {"channel": "email", "email": email, **fields}, format="json")
    assert answer.status_code == 201, answer.json()
    assert worker.idle()
    return answer.json()


def confirmation_path(message) -> str:
    return re.search(r"https?://[^/\s]+(/account/notifications/confirm/[^\s]+/)", message.body).group(1)


def finish(job) -> None:
    for status in (JobStatus.RUNNING, JobStatus.COMPLETED):
        assert transition(job.pk, status, reason="test")
    assert worker.idle()


def test_subscribing_mails_one_link_and_nothing_else_until_it_is_opened(client, make_job, owner, outbox):
    job = make_job()
    created = subscribe(owner, "owner@example.org")

    assert created["email_verified"] is False
    [link_mail] = outbox
    assert link_mail.to == ["owner@example.org"] and "Confirm" in link_mail.subject
    assert "owner asked" in link_mail.body and "within 3 days" in link_mail.body

    finish(job)
    delivery = Delivery.objects.get()
    assert (delivery.state, delivery.attempts) == ("skipped", 0)
    assert "not been confirmed" in delivery.last_error
    assert len(outbox) == 1  # the job's end was not mailed
    client.force_login(owner)
    page = client.get("/account/notifications/").content.decode()
    assert "waiting for verification" in page and "skipped" in page

    confirmed = client.get(confirmation_path(link_mail))
    assert confirmed.status_code == 200 and "Confirmed" in confirmed.content.decode()
    assert api_as(owner).get(SUBSCRIPTIONS).json()[0]["email_verified"] is True
    assert "waiting for verification" not in client.get("/account/notifications/").content.decode()

    second = make_job(name="second")
    finish(second)
    assert [m.to for m in outbox[1:]] == [["owner@example.org"]]
    assert "Running → Completed" in outbox[1].subject


def test_the_link_works_without_signing_in_but_not_after_three_days(client, owner, outbox):
    subscribe(owner, "late@example.org")
    path = confirmation_path(outbox[0])

    with time_machine.travel(timezone.now() + timedelta(days=3, minutes=1)):
        expired = client.get(path)
    assert expired.status_code == 400 and "not valid" in expired.content.decode()
    assert Subscription.objects.get().email_verified_at is None
    assert client.get(path[:-6] + "xxxxx/").status_code == 400  # a forged or truncated link

    assert client.get(path).status_code == 200  # anonymous: the mailbox's holder confirms
    assert Subscription.objects.get().email_verified_at is not None


def test_a_changed_address_needs_its_own_link(client, owner, outbox):
    created = subscribe(owner, "first@example.org")
    client.get(confirmation_path(outbox[0]))

    changed = api_as(owner).patch(f"{SUBSCRIPTIONS}{created['id']}/", {"email": "second@example.org"}, format="json")
    assert changed.status_code == 200 and changed.json()["email_verified"] is False
    assert worker.idle()
    assert [m.to for m in outbox] == [["first@example.org"], ["second@example.org"]]
    # The first address's link no longer confirms anything.
    assert client.get(confirmation_path(outbox[0])).status_code == 400
    assert client.get(confirmation_path(outbox[1])).status_code == 200


def test_an_address_the_user_confirmed_needs_no_second_link(owner, outbox):
    subscribe(owner, "me@example.org")
    APIClient().get(confirmation_path(outbox[0]))

    again = subscribe(owner, "ME@example.org", kinds=["failover"])

    assert again["email_verified"] is True and len(outbox) == 1


def test_another_users_confirmed_address_does_not_confirm_mine(owner, outsider, outbox):
    subscribe(outsider, "shared@example.org")
    APIClient().get(confirmation_path(outbox[0]))

    mine = subscribe(owner, "shared@example.org")

    assert mine["email_verified"] is False and len(outbox) == 2


def test_the_link_can_be_asked_for_again_but_not_at_once(client, owner, outbox):
    created = subscribe(owner, "again@example.org")
    client.force_login(owner)

    too_soon = client.post("/account/notifications/", {"resend": str(created["id"])}, follow=True)
    assert "less than a minute ago" in too_soon.content.decode() and len(outbox) == 1

    with time_machine.travel(timezone.now() + timedelta(minutes=2)):
        resent = api_as(owner).post(f"{SUBSCRIPTIONS}{created['id']}/send-confirmation/")
        assert resent.status_code == 202
        assert worker.idle()
    assert [m.to for m in outbox] == [["again@example.org"]] * 2


def test_confirmation_mails_per_user_and_day_are_capped(owner, teammate, settings, outbox):
    settings.NOTIFY_VERIFICATION_EMAILS_PER_DAY = 2
    first = subscribe(owner, "a@example.org")
    subscribe(owner, "b@example.org")
    api_as(owner).delete(f"{SUBSCRIPTIONS}{first['id']}/")

    refused = api_as(owner).post(SUBSCRIPTIONS, {"channel": "email", "email": "c@example.org"}, format="json")

    assert refused.status_code == 400
    assert "2 confirmation e-mails in the last day" in refused.json()["email"][0]
    assert len(outbox) == 2
    subscribe(teammate, "mate@example.org")  # another user is not held back
    assert len(outbox) == 3
