"""A job no node could ever hold is refused when it is created (form and API alike), with the
largest shape the cluster has; 0 GPUs per node is a CPU job, and the form and the job say so."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.api import JOBS_URL
from harness.pages import field_errors
from jobs.models import TrainingJob
from jobs.services.creation import personal_project_for

pytestmark = pytest.mark.django_db


def post_form(client, owner, image, **fields):
    data = {
        "name": "shape",
        "project": str(personal_project_for(owner).pk),
        "job_type": "On-Demand",
        "image": image.reference,
        "command": "python train.py",
        "gpus_per_node": "1",
        "node_count": "1",
    }
    data.update({k: str(v) for k, v in fields.items()})
    return client.post(reverse("jobs:create"), data)


def test_the_form_refuses_more_gpus_per_node_than_the_largest_node_has(login, owner, default_image, nodes):
    response = post_form(login(owner), owner, default_image, gpus_per_node=64)
    assert response.status_code == 200
    assert "the largest node has 4 GPUs" in field_errors(response.content.decode(), "gpus_per_node")
    assert not TrainingJob.objects.exists()


def test_the_api_refuses_more_nodes_than_the_cluster_has_with_the_largest_shape(owner_api, nodes):
    response = owner_api.post(JOBS_URL, {"name": "too-wide", "command": "python t.py", "gpus_per_node": 2, "node_count": 4}, format="json")
    assert response.status_code == 400
    message = response.json()["gpus_per_node"][0]
    assert "Only 3 nodes have 2 or more GPUs" in message and "3 × 2 GPUs" in message
    response = owner_api.post(JOBS_URL, {"name": "too-tall", "command": "python t.py", "gpus_per_node": 64}, format="json")
    assert response.status_code == 400
    assert "the largest node has 4 GPUs" in response.json()["gpus_per_node"][0]


def test_a_shape_that_fits_is_accepted(owner_api, nodes):
    response = owner_api.post(JOBS_URL, {"name": "fits", "command": "python t.py", "gpus_per_node": 4, "node_count": 3}, format="json")
    assert response.status_code == 201, response.json()


def test_nothing_is_refused_before_any_node_has_registered(owner_api):
    response = owner_api.post(JOBS_URL, {"name": "early", "command": "python t.py", "gpus_per_node": 8}, format="json")
    assert response.status_code == 201, response.json()


def test_zero_gpus_is_a_cpu_job_and_the_pages_say_so(login, owner, default_image, nodes):
    client = login(owner)
    assert "0 makes a CPU job" in client.get(reverse("jobs:create")).content.decode()
    response = post_form(client, owner, default_image, gpus_per_node=0)
    assert response.status_code == 302
    job = TrainingJob.objects.get(name="shape")
    assert job.total_gpus == 0
    assert "a CPU job" in client.get(reverse("jobs:detail", args=[job.pk])).content.decode()
