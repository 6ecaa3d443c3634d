"""Cloning a job: a new Pending job with the same settings, owned by whoever cloned it."""

from __future__ import annotations

import pytest

from harness.api import job_url, move_to
from jobs.models import Project, TrainingJob
from jobs.services.creation import personal_project_for
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def source(make_job, data_volume) -> TrainingJob:
    return make_job(
        name="resnet",
        job_type="Spot",
        command="torchrun --nproc_per_node=2 train.py",
        env={"EPOCHS": "3"},
        gpus_per_node=2,
        failover_enabled=False,
        output_dir="/data/resnet",
        max_run_minutes=30,
        description="baseline",
    )


def test_a_clone_is_a_new_pending_job_named_copy(owner_api, source):
    move_to(source, JobStatus.COMPLETED)

    response = owner_api.post(job_url(source, "clone"))

    assert response.status_code == 201
    body = response.json()
    assert body["name"] == "resnet-copy"
    assert body["status"] == "Pending"
    assert body["id"] != source.pk
    for field in ("job_type", "command", "env", "gpus_per_node", "failover_enabled", "output_dir", "max_run_minutes", "description"):
        assert body[field] == getattr(source, field), field


def test_cloning_again_picks_the_next_free_name(owner_api, source):
    owner_api.post(job_url(source, "clone"))

    assert owner_api.post(job_url(source, "clone")).json()["name"] == "resnet-copy-2"


def test_a_clone_may_be_given_a_name(owner_api, source):
    response = owner_api.post(job_url(source, "clone"), {"name": "resnet-v2"}, format="json")

    assert response.status_code == 201
    assert response.json()["name"] == "resnet-v2"


@pytest.mark.parametrize("name", ["resnet", "Bad_Name", "", "x" * 64, 5, None])
def test_a_bad_or_taken_clone_name_is_a_400_on_name(owner_api, source, name):
    response = owner_api.post(job_url(source, "clone"), {"name": name}, format="json")

    assert response.status_code == 400
    assert "name" in response.json()
    assert TrainingJob.objects.count() == 1


def test_a_teammates_clone_is_theirs_in_the_same_project(api_as, teammate, source):
    response = api_as(teammate).post(job_url(source, "clone"))

    assert response.status_code == 201
    assert response.json()["owner"] == "teammate"
    assert response.json()["project"] == source.project_id


def test_staff_cloning_a_job_they_are_not_a_member_of_keep_its_project(api_as, staff, source):
    response = api_as(staff).post(job_url(source, "clone"))

    assert response.json()["project"] == source.project_id


def test_a_clone_by_a_former_member_lands_in_their_personal_project(api_as, teammate, source):
    source.project.members.remove(teammate)
    source.owner = teammate  # the source stays visible to them as its owner
    source.save(update_fields=["owner"])

    response = api_as(teammate).post(job_url(source, "clone"))

    assert response.json()["project"] == personal_project_for(teammate).pk


def test_a_clone_keeps_a_warm_start_only_from_a_job_its_cloner_may_see(api_as, owner, teammate, source, make_job):
    private = Project.objects.create(name="owners-private")
    private.members.add(owner)
    trained = make_job(name="trained", project=private)
    TrainingJob.objects.filter(pk=source.pk).update(warm_start_job=trained, warm_start_step=80)

    mine = api_as(owner).post(job_url(source, "clone")).json()
    assert (mine["warm_start_job"], mine["warm_start_step"]) == (trained.pk, 80)
    theirs = api_as(teammate).post(job_url(source, "clone")).json()
    assert (theirs["warm_start_job"], theirs["warm_start_step"]) == (None, None)
