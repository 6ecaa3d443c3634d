"""One place decides what a job may be: a multi-node job whose ranks would meet only on their
hosts' network is refused on every route (create from the form and the API, clone from the API
and the page, resume) while the project's switch is off, with the same message; with the
operator's switch on, every route takes it."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from agent.inventory import register_nodes, simulated_nodes
from harness.api import JOBS_URL, job_url
from harness.pages import put_in_status
from jobs.models import Project, TrainingJob
from jobs.statuses import JobStatus
from logs.models import Checkpoint

pytestmark = pytest.mark.django_db

REFUSED = "which an operator has not allowed for project owner-personal"


@pytest.fixture
def two_hosts(db, settings):
    """Two nodes of four GPUs, each on a host of its own (its own node agent): the ranks of a
    2-node job meet only on the hosts' network."""
    settings.SIMULATED_NODES = 2
    settings.SIMULATED_GPUS_PER_NODE = 4
    return [node for n, spec in enumerate(simulated_nodes(), 1) for node in register_nodes([spec], agent=f"host-{n}")]


def allow_host_network(project: Project, allowed: bool) -> None:
    project.multi_node_host_network = allowed
    project.save(update_fields=["multi_node_host_network"])


@pytest.fixture
def across_hosts(make_job, project, two_hosts) -> TrainingJob:
    """A 2-node job created while the operator allowed the hosts' network; the switch is off now."""
    allow_host_network(project, True)
    job = make_job(name="across-hosts", node_count=2)
    allow_host_network(project, False)
    return job


def form_data(project: Project, image: str) -> dict[str, str]:
    return {
        "name": "two-nodes",
        "project": str(project.pk),
        "job_type": "On-Demand",
        "image": image,
        "command": "python train.py",
        "gpus_per_node": "1",
        "node_count": "2",
    }


@pytest.mark.parametrize("allowed", [False, True])
def test_the_create_form_takes_a_multi_node_job_only_when_the_operator_allows_the_hosts_network(login, owner, project, default_image, two_hosts, allowed):
    allow_host_network(project, allowed)
    response = login(owner).post(reverse("jobs:create"), form_data(project, default_image.reference))

    if allowed:
        assert response.status_code == 302
        assert TrainingJob.objects.get().node_count == 2
    else:
        assert response.status_code == 200 and REFUSED in response.content.decode()
        assert REFUSED in " ".join(response.context["form"].errors["node_count"])
        assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("allowed", [False, True])
def test_the_api_creates_a_multi_node_job_only_when_the_operator_allows_the_hosts_network(owner_api, project, default_image, two_hosts, allowed):
    allow_host_network(project, allowed)
    response = owner_api.post(JOBS_URL, {"name": "two-nodes", "command": "python train.py", "node_count": 2}, format="json")

    if allowed:
        assert response.status_code == 201, response.json()
    else:
        assert response.status_code == 400
        assert REFUSED in response.json()["node_count"][0]
        assert not TrainingJob.objects.exists()


@pytest.mark.parametrize("allowed", [False, True])
def test_an_api_clone_of_a_multi_node_job_follows_the_projects_switch_now(owner_api, project, across_hosts, allowed):
    allow_host_network(project, allowed)
    response = owner_api.post(job_url(across_hosts, "clone"))

    if allowed:
        assert response.status_code == 201, response.json()
        assert response.json()["node_count"] == 2
    else:
        assert response.status_code == 400
        assert REFUSED in response.json()["node_count"][0]
        assert TrainingJob.objects.count() == 1


@pytest.mark.parametrize("allowed", [False, True])
def test_the_clone_page_of_a_multi_node_job_follows_the_projects_switch_now(login, owner, project, across_hosts, allowed):
    allow_host_network(project, allowed)
    client = login(owner)
    form = client.get(reverse("jobs:clone", args=[across_hosts.pk])).context["form"]
    data = {name: form[name].value() for name in form.fields if form[name].value() is not None}
    data["failover_enabled"] = "on"
    response = client.post(reverse("jobs:clone", args=[across_hosts.pk]), data)

    if allowed:
        assert response.status_code == 302, response.context["form"].errors
        assert TrainingJob.objects.exclude(pk=across_hosts.pk).get().node_count == 2
    else:
        assert response.status_code == 200 and REFUSED in response.content.decode()
        assert TrainingJob.objects.count() == 1


@pytest.mark.parametrize("allowed", [False, True])
def test_an_api_resume_of_a_multi_node_job_follows_the_projects_switch_now(owner_api, project, across_hosts, allowed):
    job = put_in_status(across_hosts, JobStatus.STOPPED, finished_at=timezone.now())
    Checkpoint.objects.create(job=job, attempt=1, step=40, committed_at=timezone.now())
    allow_host_network(project, allowed)
    response = owner_api.post(job_url(job, "resume"))

    job.refresh_from_db()
    if allowed:
        assert response.status_code == 200 and job.status == JobStatus.PENDING
    else:
        assert response.status_code == 409
        assert REFUSED in response.json()["detail"]
        assert job.status == JobStatus.STOPPED


def test_the_resume_button_says_why_it_was_refused(login, owner, across_hosts):
    job = put_in_status(across_hosts, JobStatus.STOPPED, finished_at=timezone.now())
    Checkpoint.objects.create(job=job, attempt=1, step=40, committed_at=timezone.now())
    response = login(owner).post(reverse("jobs:resume", args=[job.pk]), follow=True)

    assert REFUSED in response.content.decode()
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED


def test_a_teammates_clone_and_resume_are_refused_the_same_way(api_as, teammate, across_hosts):
    api = api_as(teammate)
    clone = api.post(job_url(across_hosts, "clone"))
    assert clone.status_code == 400 and REFUSED in clone.json()["node_count"][0]

    job = put_in_status(across_hosts, JobStatus.STOPPED, finished_at=timezone.now())
    Checkpoint.objects.create(job=job, attempt=1, step=40, committed_at=timezone.now())
    resume = api.post(job_url(job, "resume"))
    assert resume.status_code == 409 and REFUSED in resume.json()["detail"]


def test_an_outsider_learns_nothing_of_the_job_or_its_project(api_as, outsider, across_hosts):
    api = api_as(outsider)
    put_in_status(across_hosts, JobStatus.STOPPED, finished_at=timezone.now())
    for action in ("clone", "resume"):
        response = api.post(job_url(across_hosts, action))
        assert response.status_code == 404 and "owner-personal" not in response.content.decode()
