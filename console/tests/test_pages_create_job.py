"""The Create Training Job form: defaults, a job created from valid input, and each error beside its field."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.db import IntegrityError
from django.urls import reverse

from harness.pages import field_errors, shows
from jobs.job_fields import EXAMPLE_COMMAND
from jobs.models import JobEvent, Project, TrainingJob
from jobs.services.creation import personal_project_for

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("data_volume")]


@pytest.fixture
def valid(owner, default_image) -> dict[str, str]:
    return {
        "name": "bert-finetune",
        "project": str(personal_project_for(owner).pk),
        "job_type": "Spot",
        "image": default_image.reference,
        "command": 'PYTHONPATH=$CHECKPOINT_VENDOR HF_DATASETS_OFFLINE="1" \\\npython train.py --epochs 3',
        "env_text": "LEARNING_RATE=0.001\n# a comment\nBATCH_SIZE = 16\n",
        "gpus_per_node": "2",
        "node_count": "3",
        "failover_enabled": "on",
        "output_dir": "/data/runs/bert",
        "max_run_minutes": "90",
        "description": "fine-tune BERT",
    }


def test_the_form_starts_with_the_documented_defaults(login, owner, default_image):
    response = login(owner).get(reverse("jobs:create"))
    html = response.content.decode()
    form = response.context["form"]
    assert response.status_code == 200
    assert form["project"].value() == personal_project_for(owner).pk
    assert form["image"].value() == settings.DEFAULT_IMAGE
    assert form["command"].value() == EXAMPLE_COMMAND
    assert form["gpus_per_node"].value() == 1
    assert form["node_count"].value() == 1
    assert form["failover_enabled"].value() is True
    assert form["job_type"].value() == "On-Demand"
    assert shows(html, EXAMPLE_COMMAND)
    # A user types any reference; the registered images are suggested.
    assert 'list="image-choices"' in html
    assert f'<option value="{default_image.reference}">' in html


def test_every_input_has_a_label(login, owner):
    html = login(owner).get(reverse("jobs:create")).content.decode()
    for field in (
        "name",
        "project",
        "image",
        "command",
        "env_text",
        "gpus_per_node",
        "node_count",
        "failover_enabled",
        "output_dir",
        "max_run_minutes",
        "description",
    ):
        assert f'for="id_{field}"' in html, field
    assert "<legend" in html and "Job type" in html


def test_a_valid_form_creates_the_job_and_shows_it(login, owner, valid):
    response = login(owner).post(reverse("jobs:create"), valid, follow=True)
    job = TrainingJob.objects.get()
    assert response.redirect_chain == [(reverse("jobs:detail", args=[job.pk]), 302)]
    assert (job.name, job.owner, job.project.pk, job.job_type) == ("bert-finetune", owner, int(valid["project"]), "Spot")
    assert job.env == {"LEARNING_RATE": "0.001", "BATCH_SIZE": "16"}
    assert (job.gpus_per_node, job.node_count, job.failover_enabled) == (2, 3, True)
    assert (job.output_dir, job.max_run_minutes, job.description) == ("/data/runs/bert", 90, "fine-tune BERT")
    assert job.command == valid["command"]
    assert JobEvent.objects.filter(job=job, to_status="Pending", actor="owner").exists()
    assert "Training Job bert-finetune created." in response.content.decode()


def test_failover_is_off_when_the_box_is_unchecked(login, owner, valid):
    del valid["failover_enabled"]
    login(owner).post(reverse("jobs:create"), valid)
    assert TrainingJob.objects.get().failover_enabled is False


def test_optional_fields_may_stay_empty(login, owner, valid):
    valid.update(env_text="", output_dir="", max_run_minutes="", description="")
    response = login(owner).post(reverse("jobs:create"), valid)
    assert response.status_code == 302
    job = TrainingJob.objects.get()
    assert (job.env, job.output_dir, job.max_run_minutes) == ({}, "", None)


def test_a_teammate_creates_a_job_in_the_shared_project(login, owner, teammate, valid):
    response = login(teammate).post(reverse("jobs:create"), valid)
    assert response.status_code == 302
    job = TrainingJob.objects.get()
    assert (job.owner, job.project) == (teammate, personal_project_for(owner))


def test_the_project_choices_are_the_users_own_projects(login, owner, teammate, outsider):
    personal_project_for(outsider)
    html = login(teammate).get(reverse("jobs:create")).content.decode()
    assert f'value="{personal_project_for(owner).pk}"' in html
    assert f'value="{personal_project_for(teammate).pk}"' in html
    assert "outsider-personal" not in html


def test_two_users_may_use_the_same_name(login, owner, outsider, make_job, valid):
    make_job(name="bert-finetune", owner=outsider)
    response = login(owner).post(reverse("jobs:create"), valid)
    assert response.status_code == 302


INVALID = [
    ("name", "", "This field is required."),
    ("name", "Bert_Finetune", "“_” at position 5 is not allowed"),
    ("name", "-leading-dash", "Start and end with a lowercase letter or digit"),
    ("name", "a" * 64, "It is 64 characters long; use at most 63 characters"),
    ("job_type", "Preemptible", "Select a valid choice."),
    ("image", "", "This field is required."),
    ("image", "Py Torch:1", "Use an OCI image reference"),
    ("image", "nvcr.io/nvidia/pytorch:24.05-py3", "registry nvcr.io is not one this platform pulls from"),
    ("command", "", "This field is required."),
    ("command", 'python -c "print(1)', "check quotes"),
    ("command", "HF_HOME=/tmp", "only variable assignments"),
    ("env_text", "NO_EQUALS_SIGN", "Line 1: use NAME=value."),
    ("env_text", "1BAD=x", "'1BAD' is not a valid variable name"),
    ("env_text", "CUDA_VISIBLE_DEVICES=0", "CUDA_VISIBLE_DEVICES is set by the platform"),
    ("gpus_per_node", "65", "less than or equal to 64"),
    ("gpus_per_node", "-1", "greater than or equal to 0"),
    ("gpus_per_node", "many", "Enter a whole number."),
    ("node_count", "0", "greater than or equal to 1"),
    ("node_count", "65", "less than or equal to 64"),
    ("output_dir", "runs/../../bert", "'..' is not allowed in an output directory."),
    ("max_run_minutes", "0", "greater than or equal to 1"),
    ("project", "999999", "Choose one of your projects."),
    ("description", "x" * 501, "at most 500 characters"),
]


@pytest.mark.parametrize("field,value,message", INVALID, ids=[f"{f}-{i}" for i, (f, _v, _m) in enumerate(INVALID)])
def test_each_invalid_value_is_reported_beside_its_field(login, owner, valid, field, value, message):
    valid[field] = value
    response = login(owner).post(reverse("jobs:create"), valid)
    assert response.status_code == 200
    assert shows(field_errors(response.content.decode(), field), message), response.context["form"].errors
    assert not TrainingJob.objects.exists()


def test_a_project_the_user_is_not_a_member_of_is_refused(login, owner, outsider, valid):
    valid["project"] = str(personal_project_for(outsider).pk)
    response = login(owner).post(reverse("jobs:create"), valid)
    assert shows(field_errors(response.content.decode(), "project"), "Choose one of your projects.")
    assert not TrainingJob.objects.exists()


def test_a_name_the_owner_already_uses_is_refused_with_a_clear_message(login, owner, make_job, valid):
    make_job(name="bert-finetune")
    response = login(owner).post(reverse("jobs:create"), valid)
    assert response.status_code == 200
    assert shows(field_errors(response.content.decode(), "name"), "You already have a job named “bert-finetune”.")
    assert TrainingJob.objects.count() == 1


def test_a_name_taken_by_a_concurrent_request_is_a_form_error_not_a_crash(login, owner, valid, monkeypatch):
    def taken(**fields):
        raise IntegrityError("UNIQUE constraint failed: jobs_trainingjob.owner_id, jobs_trainingjob.name")

    monkeypatch.setattr("console.pages.jobs.create_job", taken)
    response = login(owner).post(reverse("jobs:create"), valid)
    assert response.status_code == 200
    assert "You already have a job with this name." in field_errors(response.content.decode(), "name")


def test_a_form_with_errors_keeps_what_the_user_typed_and_marks_the_field(login, owner, valid):
    valid["gpus_per_node"] = "65"
    html = login(owner).post(reverse("jobs:create"), valid).content.decode()
    assert "Please correct the 1 field marked below." in html
    assert 'value="bert-finetune"' in html
    assert shows(html, "LEARNING_RATE=0.001")
    assert 'aria-invalid="true"' in html
    assert 'aria-describedby="id_gpus_per_node_helptext id_gpus_per_node_error"' in html


def test_the_users_personal_project_is_created_on_first_visit(login, owner):
    Project.objects.filter(personal_for=owner).delete()
    owner.refresh_from_db()
    response = login(owner).get(reverse("jobs:create"))
    assert response.status_code == 200
    assert Project.objects.filter(personal_for=owner, members=owner).exists()


def test_a_user_may_type_any_image_of_a_known_registry(login, owner, valid, default_image):
    from jobs.models import Registry

    # Not registered as an image: tried, and waits in imagepullbackoff if the registry has none.
    assert login(owner).post(reverse("jobs:create"), {**valid, "image": "team/trainer:v2"}).status_code == 302
    Registry.objects.create(host="registry.example.com")
    ok = {**valid, "image": "registry.example.com/team/app@sha256:" + "a" * 64, "name": "by-digest"}
    assert login(owner).post(reverse("jobs:create"), ok).status_code == 302
    response = login(owner).post(reverse("jobs:create"), {**valid, "image": "ghcr.io/someone/x:1", "name": "unknown-registry"})
    assert "registry ghcr.io is not one this platform pulls from" in field_errors(response.content.decode(), "image")
