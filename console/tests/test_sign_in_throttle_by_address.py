"""The token throttle and the sign-in lock-out key on the real client address: a rotated
X-Forwarded-For header buys nothing when the console is reached directly (NUM_PROXIES = 0), and
spraying one password across many usernames from one address is locked too, while another
client's sign-in goes on."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client
from rest_framework.test import APIClient

from harness.api import TOKEN_URL

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_counts():
    cache.clear()


def sign_in(client: APIClient, username: str, password: str, **headers) -> int:
    return client.post(TOKEN_URL, {"username": username, "password": password}, format="json", **headers).status_code


def test_rotating_x_forwarded_for_does_not_escape_the_token_throttle(owner):
    client = APIClient()
    answers = [sign_in(client, f"nobody-{n}", "x") for n in range(10)]
    assert answers == [400] * 10
    assert sign_in(client, "nobody", "x") == 429

    rotated = [sign_in(client, "nobody", "x", HTTP_X_FORWARDED_FOR=f"198.51.100.{n}") for n in range(1, 6)]
    assert rotated == [429] * 5
    assert sign_in(client, "owner", "owner-pass-1", HTTP_X_FORWARDED_FOR="203.0.113.7, 10.0.0.1") == 429
    # Another client (its own address) still gets a token.
    assert sign_in(APIClient(REMOTE_ADDR="192.0.2.50"), "owner", "owner-pass-1") == 200


def test_behind_one_proxy_the_client_is_the_address_the_proxy_appended(owner, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    client = APIClient(REMOTE_ADDR="10.0.0.2")  # the proxy
    for n in range(10):
        assert sign_in(client, f"nobody-{n}", "x", HTTP_X_FORWARDED_FOR="203.0.113.9") == 400
    assert sign_in(client, "nobody", "x", HTTP_X_FORWARDED_FOR="203.0.113.9") == 429
    # What the client put before the proxy's entry is not the key; the proxy's entry is.
    assert sign_in(client, "nobody", "x", HTTP_X_FORWARDED_FOR="198.51.100.1, 203.0.113.9") == 429
    assert sign_in(client, "owner", "owner-pass-1", HTTP_X_FORWARDED_FOR="203.0.113.10") == 200


def test_spraying_a_password_across_usernames_locks_the_address(owner, settings):
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 5
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": "1000/min"}}
    client = APIClient()
    for n in range(5):
        assert sign_in(client, f"user-{n}", "Spring2026!", HTTP_X_FORWARDED_FOR=f"198.51.100.{n}") == 400

    locked = client.post(TOKEN_URL, {"username": "user-9", "password": "Spring2026!"}, format="json")
    assert locked.status_code == 429
    assert "Too many failed sign-ins from your address" in locked.json()["detail"]
    assert sign_in(client, "owner", "owner-pass-1", HTTP_X_FORWARDED_FOR="192.0.2.1") == 429
    page = Client().post("/login/", {"username": "owner", "password": "owner-pass-1"})
    assert page.status_code == 200 and "Too many failed sign-ins from your address" in page.content.decode()
    # The owner, signing in from elsewhere, is not locked: her username's count is untouched.
    assert sign_in(APIClient(REMOTE_ADDR="192.0.2.50"), "owner", "owner-pass-1") == 200
    assert Client(REMOTE_ADDR="192.0.2.50").post("/login/", {"username": "owner", "password": "owner-pass-1"}).status_code == 302


def test_the_login_page_counts_failures_per_address_too(owner, settings):
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 3
    page = Client()
    for n in range(3):
        answer = page.post("/login/", {"username": f"user-{n}", "password": "guess"}, HTTP_X_FORWARDED_FOR=f"198.51.100.{n}")
        assert answer.status_code == 200 and "Too many failed sign-ins" not in answer.content.decode()

    locked = page.post("/login/", {"username": "owner", "password": "owner-pass-1"}, HTTP_X_FORWARDED_FOR="198.51.100.99")
    assert locked.status_code == 200 and "Too many failed sign-ins from your address" in locked.content.decode()


def test_a_success_does_not_reset_the_address_count(owner, settings):
    settings.LOGIN_ADDRESS_FAILURE_LIMIT = 4
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "DEFAULT_THROTTLE_RATES": {"token": "1000/min"}}
    client = APIClient()
    for n in range(4):
        assert sign_in(client, f"user-{n}", "guess") == 400
        if n < 3:
            assert sign_in(client, "owner", "owner-pass-1") == 200
    assert sign_in(client, "owner", "owner-pass-1") == 429
