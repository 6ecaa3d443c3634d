"""Text no column or run can hold (a lone surrogate, which JSON's "\\ud800" escape decodes to, or
a NUL) is refused with a 400 naming the field, in every text field of the job API and the form:
no job is saved, and the job list keeps answering for everyone."""

from __future__ import annotations

import json

import pytest
from django.db import connection
from django.urls import reverse

from console.forms import TrainingJobForm
from harness.api import JOBS_URL, job_url
from jobs.models import TrainingJob
from jobs.services.creation import personal_project_for

pytestmark = pytest.mark.django_db

VALID = {"name": "valid-job", "command": "python train.py"}
SUBSCRIPTIONS = "/api/v1/notifications/subscriptions/"

SURROGATE_FIELDS = [
    ("env", {"A": "\ud800"}),
    ("env", {"A\udfff": "1"}),
    ("env", {"A": "ok \udc80 not"}),
    ("name", "job-\ud800"),
    ("command", "python train.py --tag \ud800"),
    ("output_dir", "runs/\ud800"),
    ("image", "pytorch:\ud800"),
    ("description", "\udbff"),
    ("job_type", "\ud800"),
    ("project", "\ud800"),
]


def post_json(api, url: str, body: dict):
    # json.dumps writes the surrogate as the escape "\ud800", exactly what a client sends.
    return api.post(url, json.dumps(body), content_type="application/json")


@pytest.mark.parametrize(("field", "value"), SURROGATE_FIELDS, ids=[f"{f}={v!r}" for f, v in SURROGATE_FIELDS])
def test_a_lone_surrogate_in_any_field_is_a_400_naming_it(owner_api, field, value):
    response = post_json(owner_api, JOBS_URL, {**VALID, field: value})

    assert response.status_code == 400
    errors = response.json()
    assert list(errors) == [field], errors
    assert "lone surrogate" in errors[field][0]
    assert not TrainingJob.objects.exists()


def test_the_env_error_says_which_variable(owner_api):
    response = post_json(owner_api, JOBS_URL, {**VALID, "env": {"HF_HOME": "/tmp/\ud800"}})

    assert response.json() == {"env": ["env.HF_HOME contains a lone surrogate (U+D800), which is not valid Unicode text."]}


def test_the_job_list_still_answers_for_the_owner_and_staff(owner_api, api_as, staff, make_job):
    make_job(name="fine")
    assert post_json(owner_api, JOBS_URL, {**VALID, "env": {"A": "\ud800"}}).status_code == 400

    for api in (owner_api, api_as(staff)):
        listing = api.get(JOBS_URL)
        assert listing.status_code == 200
        assert [job["name"] for job in listing.json()["results"]] == ["fine"]


def test_a_valid_astral_character_is_kept(owner_api):
    # A surrogate *pair* is one valid character: JSON's escapes for it decode to U+1F600.
    response = post_json(owner_api, JOBS_URL, {**VALID, "env": {"A": "\ud83d\ude00"}, "description": "\ud83d\ude00"})

    assert response.status_code == 201, response.json()
    assert TrainingJob.objects.get().env == {"A": "\U0001f600"}


def test_a_clone_name_with_a_lone_surrogate_is_a_400(owner_api, make_job):
    source = make_job(name="source")

    response = post_json(owner_api, job_url(source, "clone"), {"name": "copy-\ud800"})

    assert response.status_code == 400 and "name" in response.json()
    assert list(TrainingJob.objects.values_list("name", flat=True)) == ["source"]


def test_a_job_stored_before_the_refusal_does_not_break_the_list(owner_api, make_job):
    if connection.vendor != "sqlite":
        pytest.skip("only SQLite ever stored such text: PostgreSQL refuses it in a JSON column itself")
    make_job(name="old", env={"A": "\ud800"})  # as an earlier version let it in
    make_job(name="fine")

    listing = owner_api.get(JOBS_URL)

    assert listing.status_code == 200
    assert sorted(job["name"] for job in listing.json()["results"]) == ["fine", "old"]


@pytest.mark.parametrize("field", ["url", "email"])
def test_a_subscription_with_a_lone_surrogate_is_a_400(owner_api, field):
    body = {"channel": "webhook" if field == "url" else "email", field: "x\ud800@example.org" if field == "email" else "https://example.org/\ud800"}

    response = post_json(owner_api, SUBSCRIPTIONS, body)

    assert response.status_code == 400 and field in response.json()
    assert owner_api.get(SUBSCRIPTIONS).status_code == 200


@pytest.mark.parametrize("field", ["name", "command", "env_text", "output_dir", "memory_limit_mb", "description"])
@pytest.mark.parametrize("bad", ["\ud800", "\x00"])
def test_the_form_refuses_the_same_text_beside_its_field(owner, default_image, field, bad):
    data = {
        "name": "form-job",
        "project": str(personal_project_for(owner).pk),
        "job_type": "On-Demand",
        "image": default_image.reference,
        "command": "python train.py",
        "gpus_per_node": "1",
        "node_count": "1",
    }
    data[field] = data.get(field, "A=1" if field == "env_text" else "x") + bad

    form = TrainingJobForm(data=data, owner=owner)

    assert not form.is_valid()
    assert field in form.errors, form.errors
    assert "NUL character" in str(form.errors[field]) or "lone surrogate" in str(form.errors[field])


def test_the_create_page_refuses_a_nul_in_the_description(client, owner, default_image):
    client.force_login(owner)
    data = {
        "name": "page-job",
        "project": str(personal_project_for(owner).pk),
        "job_type": "On-Demand",
        "image": default_image.reference,
        "command": "python train.py",
        "gpus_per_node": "1",
        "node_count": "1",
        "description": "a\x00b",
    }

    response = client.post(reverse("jobs:create"), data)

    assert response.status_code == 200 and "NUL character" in response.content.decode()
    assert not TrainingJob.objects.exists()
