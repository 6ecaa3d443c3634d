"""Creating a job through the API: defaults, the project it lands in, and its first event."""

from __future__ import annotations

import pytest
from django.conf import settings

from harness.api import JOBS_URL
from jobs.models import JobEvent, Project, TrainingJob

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("data_volume")]


COMMAND = 'PYTHONPATH=$CHECKPOINT_VENDOR HF_DATASETS_OFFLINE="1" python train.py'


def test_it_creates_a_pending_job_with_the_defaults(owner_api, owner, project):
    response = owner_api.post(JOBS_URL, {"name": "bert-base", "command": COMMAND}, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "Pending"
    assert body["owner"] == "owner"
    assert body["project"] == project.pk
    assert body["project_name"] == project.name
    assert body["image"] == settings.DEFAULT_IMAGE
    assert body["job_type"] == "On-Demand"
    assert body["gpus_per_node"] == 1 and body["node_count"] == 1 and body["total_gpus"] == 1
    assert body["failover_enabled"] is True
    assert body["env"] == {}
    assert body["output_dir"] == "" and body["max_run_minutes"] is None
    assert body["failover_count"] == 0
    assert body["failover_attempts"] == f"0/{settings.MAX_FAILOVERS}"
    assert body["running_time_seconds"] is None and body["started_at"] is None
    assert TrainingJob.objects.get(pk=body["id"]).owner == owner


def test_it_records_the_creation_as_the_first_event(owner_api):
    response = owner_api.post(JOBS_URL, {"name": "bert-base", "command": COMMAND}, format="json")

    event = JobEvent.objects.get(job_id=response.json()["id"])
    assert (event.from_status, event.to_status, event.actor) == ("", "Pending", "owner")


def test_it_keeps_every_field_it_was_given(owner_api, project):
    fields = {
        "name": "llama-multi",
        "project": project.pk,
        "job_type": "Spot",
        "image": "pytorch:2.13-py3.11",
        "command": "deepspeed --num_gpus=2 train.py",
        "env": {"HF_DATASETS_OFFLINE": "1", "EPOCHS": 3},
        "gpus_per_node": 2,
        "node_count": 2,
        "failover_enabled": False,
        "output_dir": "/data/out",
        "max_run_minutes": 90,
        "description": "two nodes",
    }
    response = owner_api.post(JOBS_URL, fields, format="json")

    assert response.status_code == 201, response.json()
    body = response.json()
    assert {k: body[k] for k in fields} == {**fields, "env": {"HF_DATASETS_OFFLINE": "1", "EPOCHS": "3"}}
    assert body["total_gpus"] == 4


def test_it_accepts_an_image_the_console_does_not_know(owner_api):
    response = owner_api.post(JOBS_URL, {"name": "odd-image", "command": COMMAND, "image": "nobody/unknown:0.1"}, format="json")

    assert response.status_code == 201
    assert response.json()["image"] == "nobody/unknown:0.1"


def test_a_teammate_may_create_a_job_in_the_shared_project(api_as, teammate, project):
    response = api_as(teammate).post(JOBS_URL, {"name": "shared", "command": COMMAND, "project": project.pk}, format="json")

    assert response.status_code == 201
    assert response.json()["project_name"] == project.name
    assert response.json()["owner"] == "teammate"


def test_a_job_without_a_project_goes_to_the_creators_personal_project(api_as, teammate):
    response = api_as(teammate).post(JOBS_URL, {"name": "mine", "command": COMMAND}, format="json")

    assert response.json()["project_name"] == Project.objects.get(personal_for=teammate).name


def test_an_outsider_may_not_create_a_job_in_someone_elses_project(api_as, outsider, project):
    response = api_as(outsider).post(JOBS_URL, {"name": "intruder", "command": COMMAND, "project": project.pk}, format="json")

    assert response.status_code == 400
    assert "project" in response.json()
    assert not TrainingJob.objects.filter(name="intruder").exists()


def test_staff_may_create_a_job_in_any_project(api_as, staff, project):
    response = api_as(staff).post(JOBS_URL, {"name": "ops-job", "command": COMMAND, "project": project.pk}, format="json")

    assert response.status_code == 201
    assert response.json()["project"] == project.pk


def test_two_users_may_use_the_same_job_name(api_as, owner_api, teammate):
    assert owner_api.post(JOBS_URL, {"name": "same", "command": COMMAND}, format="json").status_code == 201
    assert api_as(teammate).post(JOBS_URL, {"name": "same", "command": COMMAND}, format="json").status_code == 201


def test_an_anonymous_caller_may_not_create_a_job(api_as):
    response = api_as(None).post(JOBS_URL, {"name": "anon", "command": COMMAND}, format="json")

    assert response.status_code in (401, 403)
    assert not TrainingJob.objects.exists()
