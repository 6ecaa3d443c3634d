"""A job's CPU and memory limits: asked for in the form and the API (checked against the largest
node), shown on the detail page with the default for what the job left empty, and the Nodes page
says where limits are not enforced."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.api import JOBS_URL, NODES_URL
from harness.pages import field_errors, shows
from jobs.models import Node, TrainingJob
from jobs.services.creation import personal_project_for
from jobs.services.limits import parse_memory

pytestmark = pytest.mark.django_db


@pytest.fixture
def sized_nodes(nodes):
    """The simulated nodes, each with 8 CPUs and 16 GiB; node-c cannot enforce limits."""
    Node.objects.update(cpu_count=8, memory_mb=16384, limits_enforced=True, limits_note="cgroup v1")
    Node.objects.filter(name="node-c").update(
        limits_enforced=False, limits_note="CPU and memory limits not enforced: cannot create a cgroup v1: Permission denied"
    )
    return Node.objects.order_by("name")


def create(api, **fields):
    return api.post(JOBS_URL, {"name": "limited", "command": "python train.py", **fields}, format="json")


def test_the_api_takes_limits_and_reports_what_each_run_gets(owner_api, sized_nodes, default_image, settings):
    settings.JOB_DEFAULT_MEMORY_MB = 4096
    response = create(owner_api, cpu_limit=0.5)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert (body["cpu_limit"], body["memory_limit_mb"]) == (0.5, None)
    assert body["limits"] == {"cpus": 0.5, "memory_mb": 4096, "text": "0.5 CPU cores, 4 GiB memory (default)"}
    job = TrainingJob.objects.get()
    assert (job.cpu_limit, job.memory_limit_mb) == (0.5, None)


@pytest.mark.parametrize(
    "fields, field, message",
    [
        ({"cpu_limit": 0}, "cpu_limit", "Ask for at least 0.01 CPU cores"),
        ({"cpu_limit": -1}, "cpu_limit", "Ask for at least 0.01 CPU cores"),
        ({"cpu_limit": 9}, "cpu_limit", "The largest node has 8 CPU cores: ask for at most 8."),
        ({"cpu_limit": "half"}, "cpu_limit", "A valid number is required."),
        ({"cpu_limit": "NaN"}, "cpu_limit", "A valid number is required."),
        ({"cpu_limit": "1e400"}, "cpu_limit", "A valid number is required."),
        ({"memory_limit_mb": 16}, "memory_limit_mb", "Ask for at least 32 MiB of memory."),
        ({"memory_limit_mb": 16385}, "memory_limit_mb", "The largest node has 16 GiB of memory (16384 MiB): ask for at most that."),
        ({"memory_limit_mb": 2**63}, "memory_limit_mb", ""),
        ({"memory_limit_mb": "8G"}, "memory_limit_mb", "A valid integer is required."),
        ({"memory_limit_mb": 1.5}, "memory_limit_mb", "A valid integer is required."),
    ],
)
def test_the_api_refuses_limits_no_node_can_give_with_a_clear_message(owner_api, sized_nodes, default_image, fields, field, message):
    response = create(owner_api, **fields)
    assert response.status_code == 400
    errors = response.json()[field]
    assert errors and all(isinstance(e, str) and e for e in errors)
    if message:
        assert errors[0].startswith(message), errors
    assert not TrainingJob.objects.exists()


def test_the_form_takes_limits_with_units_and_refuses_bad_ones_beside_the_field(login, owner, sized_nodes, default_image):
    page = login(owner)
    valid = {
        "name": "limited",
        "project": str(personal_project_for(owner).pk),
        "job_type": "On-Demand",
        "image": default_image.reference,
        "command": "python train.py",
        "gpus_per_node": "1",
        "node_count": "1",
    }
    html = page.get(reverse("jobs:create")).content.decode()
    assert 'for="id_cpu_limit"' in html and 'for="id_memory_limit_mb"' in html
    response = page.post(reverse("jobs:create"), {**valid, "cpu_limit": "64", "memory_limit_mb": "lots"})
    html = response.content.decode()
    assert shows(field_errors(html, "cpu_limit"), "The largest node has 8 CPU cores: ask for at most 8.")
    assert shows(field_errors(html, "memory_limit_mb"), "Give the memory as MiB, or with a unit: 512M, 8G, 1.5 GiB.")
    response = page.post(reverse("jobs:create"), {**valid, "cpu_limit": "1.5", "memory_limit_mb": "2G"})
    assert response.status_code == 302
    job = TrainingJob.objects.get()
    assert (job.cpu_limit, job.memory_limit_mb) == (1.5, 2048)


@pytest.mark.parametrize("text, mb", [("512", 512), ("512M", 512), ("512 MiB", 512), ("8G", 8192), ("1.5 GiB", 1536), ("2gb", 2048)])
def test_memory_is_read_with_or_without_a_unit(text, mb):
    assert parse_memory(text) == mb


def test_the_detail_page_shows_the_limits_and_where_they_are_not_enforced(login, owner, make_job, sized_nodes, settings):
    settings.JOB_DEFAULT_CPUS = 2
    job = make_job(memory_limit_mb=1536)
    html = login(owner).get(reverse("jobs:detail", args=[job.pk])).content.decode()
    assert shows(html, "2 CPU cores (default), 1.5 GiB memory per node")
    # Not placed yet: it could land on node-c, which runs jobs without limits.
    assert shows(html, "not enforced on node-c: CPU and memory limits not enforced: cannot create a cgroup v1: Permission denied")


def test_the_detail_page_says_when_a_job_has_no_limits(login, owner, make_job, sized_nodes, settings):
    settings.JOB_DEFAULT_MEMORY_MB = 0  # an operator's choice: no default memory limit
    html = login(owner).get(reverse("jobs:detail", args=[make_job().pk])).content.decode()
    assert shows(html, "no CPU limit, no memory limit per node")
    assert 'data-field="limits-unenforced"' not in html


def test_the_nodes_page_and_api_say_whether_each_node_enforces_limits(login, staff, sized_nodes, api_as):
    html = login(staff).get(reverse("nodes:list")).content.decode()
    assert shows(html, "8 CPUs, 16 GiB · CPU and memory limits enforced (cgroup v1)")
    assert shows(html, "CPU and memory limits not enforced: cannot create a cgroup v1: Permission denied")
    nodes = {n["name"]: n for n in api_as(staff).get(NODES_URL).json()["results"]}
    assert nodes["node-a"]["limits_enforced"] is True and nodes["node-c"]["limits_enforced"] is False
    assert nodes["node-a"]["cpu_count"] == 8 and nodes["node-a"]["memory_mb"] == 16384


def test_a_clone_keeps_the_limits(owner_api, make_job, sized_nodes):
    job = make_job(cpu_limit=0.25, memory_limit_mb=512)
    response = owner_api.post(f"{JOBS_URL}{job.pk}/clone/", {}, format="json")
    assert response.status_code == 201, response.json()
    assert (response.json()["cpu_limit"], response.json()["memory_limit_mb"]) == (0.25, 512)
