"""Scripts authenticate with a token they get for their username and password."""
from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from console.tests.api_fixtures import JOBS_URL, TOKEN_URL  # noqa: F401

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


def test_asking_twice_gives_the_same_token(owner):
    client = APIClient()
    first = client.post(TOKEN_URL, {"username": "owner", "password": "owner-pass-1"}, format="json").json()
    second = client.post(TOKEN_URL, {"username": "owner", "password": "owner-pass-1"}).json()

    assert first["token"] == second["token"]


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
