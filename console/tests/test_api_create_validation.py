"""Invalid input to create a job is a 400 that names the field, never a 500."""

from __future__ import annotations

import pytest

from harness.api import JOBS_URL
from jobs.models import Node, TrainingJob

pytestmark = pytest.mark.django_db

VALID = {"name": "valid-job", "command": "python train.py"}

BAD_FIELDS = [
    ("name", "Bert_Base"),
    ("name", "-leading-dash"),
    ("name", "a" * 64),
    ("name", ""),
    ("name", 12),
    ("name", "nul\x00name"),
    ("project", 10**30),
    ("project", "first"),
    ("project", 999_999),
    ("project", True),
    ("job_type", "Reserved"),
    ("job_type", ["Spot"]),
    ("image", "No Such:Image"),
    ("image", "ghcr.io/unknown/registry:1"),
    ("image", "bad image:1"),
    ("image", ""),
    ("image", {"name": "x"}),
    ("image", 3.1),
    ("command", ""),
    ("command", "python 'unclosed"),
    ("command", "python train.py\x00"),
    ("command", 42),
    ("env", ["A=1"]),
    ("env", "A=1"),
    ("env", {"1BAD": "x"}),
    ("env", {"CUDA_VISIBLE_DEVICES": "0"}),
    ("env", {"A": {"nested": 1}}),
    ("env", {"A": True}),
    ("env", {"A": "nul\x00"}),
    ("gpus_per_node", -1),
    ("gpus_per_node", 65),
    ("gpus_per_node", 10**40),
    ("gpus_per_node", "four"),
    ("gpus_per_node", 1.5),
    ("node_count", 0),
    ("node_count", 65),
    ("node_count", None),
    ("failover_enabled", "maybe"),
    ("failover_enabled", None),
    ("output_dir", "/etc/out"),
    ("output_dir", "/data/\x00out"),
    ("output_dir", "/" + "x" * 600),
    ("max_run_minutes", 0),
    ("max_run_minutes", -5),
    ("max_run_minutes", 2**63),
    ("max_run_minutes", "soon"),
    ("description", "d" * 501),
    ("description", "\x00"),
    ("description", 7),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS, ids=[f"{f}={v!r}"[:40] for f, v in BAD_FIELDS])
def test_it_refuses_a_bad_value_with_an_error_on_that_field(owner_api, field, value):
    response = owner_api.post(JOBS_URL, {**VALID, field: value}, format="json")

    assert response.status_code == 400
    errors = response.json()
    assert field in errors, errors
    assert all(isinstance(message, str) and message for message in errors[field])
    assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("field", ["name", "command"])
def test_it_requires_a_name_and_a_command(owner_api, field):
    body = {k: v for k, v in VALID.items() if k != field}

    response = owner_api.post(JOBS_URL, body, format="json")

    assert response.status_code == 400
    assert field in response.json()


def test_it_explains_why_a_command_is_refused(owner_api):
    response = owner_api.post(JOBS_URL, {**VALID, "command": "CUDA_VISIBLE_DEVICES=3 python train.py"}, format="json")

    assert "CUDA_VISIBLE_DEVICES is set by the platform" in response.json()["command"][0]


def test_it_refuses_a_name_the_owner_already_uses(owner_api, make_job):
    make_job(name="valid-job")

    response = owner_api.post(JOBS_URL, VALID, format="json")

    assert response.status_code == 400
    assert response.json()["name"] == ["You already have a job named valid-job."]
    assert TrainingJob.objects.count() == 1


NOT_AN_OBJECT = [
    b"[1, 2]",
    b'"a string"',
    b"null",
    b'{"name": ',
    b'{"name": "x", "command": "python t.py", "gpus_per_node": NaN}',
    b'{"name": "x", "command": "python t.py", "gpus_per_node": 1e400}',
]


@pytest.mark.parametrize("body", NOT_AN_OBJECT)
def test_a_body_that_is_not_a_valid_json_object_is_a_400(owner_api, body):
    response = owner_api.post(JOBS_URL, body, content_type="application/json")

    assert response.status_code == 400
    assert not TrainingJob.objects.exists()


def test_multi_node_jobs_need_their_projects_leave_to_use_the_nodes_network(owner_api, project, nodes, client, owner):
    from django.urls import reverse

    project.multi_node_host_network = False
    project.save()
    # Every node on a host of its own (a node agent each): ranks would meet only on the hosts' network.
    for node in nodes:
        Node.objects.filter(pk=node.pk).update(agent=f"nodeagent@{node.name}")
    response = owner_api.post(JOBS_URL, {**VALID, "node_count": 2}, format="json")
    assert response.status_code == 400
    assert "an operator has not allowed for project" in response.json()["node_count"][0]
    client.force_login(owner)
    form = client.post(
        reverse("jobs:create"),
        {
            "name": "two-nodes",
            "project": project.pk,
            "job_type": "On-Demand",
            "image": "pytorch:2.13-py3.11",
            "command": "python train.py",
            "gpus_per_node": 1,
            "node_count": 2,
        },
    )
    assert "an operator has not allowed for project" in form.content.decode()
    assert owner_api.post(JOBS_URL, {**VALID, "node_count": 1}, format="json").status_code == 201
