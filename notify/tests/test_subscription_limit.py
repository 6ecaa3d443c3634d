"""A user holds at most NOTIFY_MAX_SUBSCRIPTIONS_PER_USER subscriptions; the next is refused
with a clear error, and another user can still subscribe."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from notify.models import Subscription

SUBSCRIPTIONS = "/api/v1/notifications/subscriptions/"
pytestmark = pytest.mark.django_db


def api_as(user) -> APIClient:
    api = APIClient()
    api.force_authenticate(user)
    return api


def test_the_default_cap_is_twenty(settings):
    assert settings.NOTIFY_MAX_SUBSCRIPTIONS_PER_USER == 20


def test_subscriptions_past_the_cap_are_refused(owner, outsider, settings, client):
    settings.NOTIFY_MAX_SUBSCRIPTIONS_PER_USER = 3
    settings.NOTIFY_WEBHOOK_ALLOW_PRIVATE = True
    api = api_as(owner)
    for n in range(3):
        assert api.post(SUBSCRIPTIONS, {"channel": "webhook", "url": f"http://127.0.0.1:9/{n}"}, format="json").status_code == 201

    refused = api.post(SUBSCRIPTIONS, {"channel": "webhook", "url": "http://127.0.0.1:9/4"}, format="json")

    assert refused.status_code == 400
    assert refused.json() == {"non_field_errors": ["You have 3 subscriptions, the most allowed: delete one first."]}
    assert Subscription.objects.filter(user=owner).count() == 3
    client.force_login(owner)
    page = client.post("/account/notifications/", {"channel": "webhook", "url": "http://127.0.0.1:9/5", "scope": "mine"})
    assert "the most allowed: delete one first" in page.content.decode()
    # Changing one that exists is not a new one.
    first = Subscription.objects.filter(user=owner).last()
    assert api.patch(f"{SUBSCRIPTIONS}{first.pk}/", {"active": False}, format="json").status_code == 200
    # Another user is not held back.
    assert api_as(outsider).post(SUBSCRIPTIONS, {"channel": "webhook", "url": "http://127.0.0.1:9/x"}, format="json").status_code == 201
    api.delete(f"{SUBSCRIPTIONS}{first.pk}/")
    assert api.post(SUBSCRIPTIONS, {"channel": "webhook", "url": "http://127.0.0.1:9/4"}, format="json").status_code == 201
