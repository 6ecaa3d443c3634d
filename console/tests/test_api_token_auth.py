"""Scripts authenticate with a token they get for their username and password."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from harness.api import JOBS_URL, TOKEN_URL

pytestmark = pytest.mark.django_db


def test_a_user_gets_a_token_and_lists_their_jobs_with_it(owner, make_job):
    make_job(name="mine")
    client = APIClient()

    response = client.post(TOKEN_URL, {"username": "owner", "password": "owner-pass-1"}, format="json")
    assert response.status_code == 200
    token = response.json()["token"]

    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    listing = client.get(JOBS_URL)
    assert listing.status_code == 200
    assert [j["name"] for j in listing.json()["results"]] == ["mine"]


def test_each_request_gives_a_new_expiring_token_stored_only_as_a_digest(owner):
    from knox.models import AuthToken

    client = APIClient()
    first = client.post(TOKEN_URL, {"username": "owner", "password": "owner-pass-1"}, format="json").json()
    second = client.post(TOKEN_URL, {"username": "owner", "password": "owner-pass-1"}).json()

    assert first["token"] != second["token"] and first["expiry"] and second["expiry"]
    stored = list(AuthToken.objects.filter(user=owner).values_list("digest", flat=True))
    assert len(stored) == 2 and first["token"] not in stored and second["token"] not in stored


@pytest.mark.parametrize(
    "body",
    [
        {"username": "owner", "password": "wrong"},
        {"username": "nobody", "password": "owner-pass-1"},
        {"username": "owner"},
        {},
        {"username": "owner\x00", "password": "x"},
    ],
)
def test_bad_credentials_are_a_400_without_a_token(owner, body):
    response = APIClient().post(TOKEN_URL, body, format="json")

    assert response.status_code == 400
    assert "token" not in response.json()


def test_a_token_can_create_a_job_without_a_csrf_token(owner):
    client = APIClient(enforce_csrf_checks=True)
    token = client.post(TOKEN_URL, {"username": "owner", "password": "owner-pass-1"}, format="json").json()["token"]
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")

    response = client.post(JOBS_URL, {"name": "scripted", "command": "python train.py"}, format="json")

    assert response.status_code == 201


def test_a_wrong_token_is_refused(owner):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")

    assert client.get(JOBS_URL).status_code in (401, 403)


def test_a_signed_in_browser_session_works_too(owner, make_job):
    make_job(name="mine")
    client = APIClient()
    assert client.login(username="owner", password="owner-pass-1")

    assert client.get(JOBS_URL).json()["count"] == 1


def test_guessing_a_password_locks_the_user_even_for_the_right_one(owner, settings):
    from django.core.cache import cache

    cache.clear()
    settings.LOGIN_FAILURE_LIMIT = 5
    client = APIClient()
    for guess in range(5):
        assert client.post(TOKEN_URL, {"username": "owner", "password": f"guess-{guess}"}, format="json").status_code == 400
    locked = client.post(TOKEN_URL, {"username": "owner", "password": "owner-pass-1"}, format="json")
    assert locked.status_code == 429
    assert "Too many failed sign-ins" in locked.json()["detail"]
    page = Client().post("/login/", {"username": "owner", "password": "owner-pass-1"})
    assert page.status_code == 200 and "Too many failed sign-ins" in page.content.decode()


def test_the_token_endpoint_is_throttled(owner, settings):
    from django.core.cache import cache

    cache.clear()
    client = APIClient()
    answers = [client.post(TOKEN_URL, {"username": "nobody", "password": "x"}, format="json").status_code for _ in range(12)]
    assert answers[:10] == [400] * 10 and answers[10:] == [429, 429]


def test_a_revoked_token_stops_working(owner):
    client = APIClient()
    token = client.post(TOKEN_URL, {"username": "owner", "password": "owner-pass-1"}, format="json").json()["token"]
    page = Client()
    page.force_login(owner)
    assert token[:8] in page.get("/account/tokens/").content.decode()
    page.post("/account/tokens/", {"revoke": "all"})
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    assert client.get(JOBS_URL).status_code in (401, 403)
