"""The form says everything that is wrong at once, and cuts nothing: a long name, each wrong
character and where it is, every bad environment line."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs.job_fields import dns_label_problems
from jobs.services.creation import personal_project_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("data_volume")]


@pytest.fixture
def post(login, owner, default_image):
    def send(**fields: str):
        data = {
            "name": "ok",
            "project": str(personal_project_for(owner).pk),
            "job_type": "On-Demand",
            "image": default_image.reference,
            "command": "python t.py",
            "gpus_per_node": "1",
            "node_count": "1",
        }
        data.update(fields)
        return login(owner).post(reverse("jobs:create"), data)

    return send


def test_the_name_input_has_no_maxlength_so_the_browser_cuts_nothing(login, owner):
    html = login(owner).get(reverse("jobs:create")).content.decode()
    name_input = html[html.index('name="name"') - 200 : html.index('name="name"') + 200]
    assert "maxlength" not in name_input


def test_a_70_character_name_is_refused_whole_with_its_length(post):
    response = post(name="a" * 70)
    assert response.context["form"].errors["name"] == ["It is 70 characters long; use at most 63 characters (nothing was cut)."]
    assert response.context["form"]["name"].value() == "a" * 70


def test_each_wrong_character_is_named_with_its_position(post):
    errors = post(name="My_Job.v2").context["form"].errors["name"]
    assert "“M” at position 1 is not allowed (use “m”): use lowercase letters, digits and '-'." in errors
    assert "“J” at position 4 is not allowed (use “j”): use lowercase letters, digits and '-'." in errors
    assert "“_” at position 3 is not allowed: use lowercase letters, digits and '-'." in errors
    assert "“.” at position 7 is not allowed: use lowercase letters, digits and '-'." in errors


def test_a_name_can_be_wrong_in_several_ways_at_once():
    problems = dns_label_problems("-" + "x" * 62 + " ")
    assert problems[0].startswith("It is 64 characters long")
    assert "' ' at position 64 is not allowed" in problems[1]
    assert problems[2] == "Start and end with a lowercase letter or digit, not '-'."
    assert dns_label_problems("bert-finetune-2") == []


def test_every_bad_environment_line_is_reported(post):
    text = "GOOD=1\nNO_EQUALS\n1BAD=x\nCUDA_VISIBLE_DEVICES=0\nGOOD=2\n"
    errors = post(env_text=text).context["form"].errors["env_text"]
    assert errors == [
        "Line 2: use NAME=value.",
        "Line 3: '1BAD' is not a valid variable name (letters, digits and _, not starting with a digit).",
        "Line 4: CUDA_VISIBLE_DEVICES is set by the platform for every run and cannot be overridden.",
        "Line 5: GOOD is already set on an earlier line.",
    ]


def test_the_api_reports_every_bad_variable_and_the_name_in_full(owner_api, default_image):
    response = owner_api.post(
        "/api/v1/training-jobs/",
        {"name": "A" * 70, "command": "python t.py", "env": {"1BAD": "x", "RANK": "3", "OK": "1"}},
        format="json",
    )
    assert response.status_code == 400
    body = response.json()
    assert body["name"][0] == "It is 70 characters long; use at most 63 characters (nothing was cut)."
    assert "“A” at position 1, 2, 3, 4, 5 … is not allowed" in body["name"][1]
    assert len(body["env"]) == 2 and "'1BAD'" in body["env"][0] and "RANK" in body["env"][1]
