"""Clone: the create form prefilled from an existing job, named <name>-copy; posting it creates a new job."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.pages import put_in_status
from jobs.models import TrainingJob
from jobs.services.creation import personal_project_for
from jobs.statuses import JobStatus

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("data_volume")]


@pytest.fixture
def source(make_job) -> TrainingJob:
    job = make_job(
        name="llama-sft",
        job_type="Spot",
        command="torchrun --nproc_per_node 4 train.py",
        env={"LR": "0.0002", "SEED": "7"},
        gpus_per_node=4,
        node_count=2,
        failover_enabled=False,
        output_dir="/data/llama",
        max_run_minutes=600,
        description="supervised fine-tuning",
    )
    return put_in_status(job, JobStatus.FAILED)


def form_data(form) -> dict[str, object]:
    data = {}
    for name, _field in form.fields.items():
        value = form[name].value()
        if name == "failover_enabled":
            if value:
                data[name] = "on"
            continue
        data[name] = "" if value is None else (value.pk if hasattr(value, "pk") else value)
    return data


def test_the_clone_form_is_prefilled_from_the_job(login, owner, source):
    response = login(owner).get(reverse("jobs:clone", args=[source.pk]))
    form = response.context["form"]
    assert response.status_code == 200
    assert form["name"].value() == "llama-sft-copy"
    assert form["command"].value() == "torchrun --nproc_per_node 4 train.py"
    assert form["env_text"].value() == "LR=0.0002\nSEED=7"
    assert (form["gpus_per_node"].value(), form["node_count"].value()) == (4, 2)
    assert form["failover_enabled"].value() is False
    assert (form["job_type"].value(), form["output_dir"].value(), form["max_run_minutes"].value()) == ("Spot", "/data/llama", 600)
    assert form["project"].value() == source.project.pk
    assert "Clone Training Job" in response.content.decode()


def test_posting_the_clone_form_creates_a_new_pending_job(login, owner, source):
    client = login(owner)
    data = form_data(client.get(reverse("jobs:clone", args=[source.pk])).context["form"])
    response = client.post(reverse("jobs:clone", args=[source.pk]), data)
    clone = TrainingJob.objects.get(name="llama-sft-copy")
    assert response.status_code == 302
    assert response["Location"] == reverse("jobs:detail", args=[clone.pk])
    assert clone.status == JobStatus.PENDING
    assert (clone.env, clone.gpus_per_node, clone.node_count, clone.failover_enabled) == ({"LR": "0.0002", "SEED": "7"}, 4, 2, False)
    assert clone.pk != source.pk


def test_the_clone_may_change_settings_before_it_is_created(login, owner, source):
    client = login(owner)
    data = form_data(client.get(reverse("jobs:clone", args=[source.pk])).context["form"])
    data.update(name="llama-sft-bigger", node_count=4)
    client.post(reverse("jobs:clone", args=[source.pk]), data)
    assert TrainingJob.objects.get(name="llama-sft-bigger").node_count == 4


def test_a_second_clone_gets_the_next_free_name(login, owner, source, make_job):
    make_job(name="llama-sft-copy")
    form = login(owner).get(reverse("jobs:clone", args=[source.pk])).context["form"]
    assert form["name"].value() == "llama-sft-copy-2"


def test_an_invalid_clone_shows_the_errors_on_the_form(login, owner, source):
    client = login(owner)
    data = form_data(client.get(reverse("jobs:clone", args=[source.pk])).context["form"])
    data["command"] = 'python -c "unclosed'
    response = client.post(reverse("jobs:clone", args=[source.pk]), data)
    assert response.status_code == 200
    assert "check quotes" in response.context["form"].errors["command"][0]
    assert TrainingJob.objects.count() == 1


def test_a_teammate_clones_into_the_shared_project_as_its_owner(login, owner, teammate, source):
    client = login(teammate)
    data = form_data(client.get(reverse("jobs:clone", args=[source.pk])).context["form"])
    client.post(reverse("jobs:clone", args=[source.pk]), data)
    clone = TrainingJob.objects.get(owner=teammate)
    assert (clone.name, clone.project) == ("llama-sft-copy", personal_project_for(owner))


def test_staff_clone_a_job_of_a_project_they_are_not_in_into_their_own(login, staff, source):
    form = login(staff).get(reverse("jobs:clone", args=[source.pk])).context["form"]
    assert form["project"].value() == personal_project_for(staff).pk
