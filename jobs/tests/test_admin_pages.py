"""The operators' admin: every model's pages load for staff, and non-staff are kept out."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs.models import GPU, Image, JobAttempt, JobEvent, Node, Project, TrainingJob
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import run_started

pytestmark = pytest.mark.django_db

MODELS = [Node, GPU, Image, Project, TrainingJob, JobAttempt, JobEvent]


@pytest.fixture
def history(nodes, make_job, teammate):
    job = make_job(gpus_per_node=2)
    place_waiting_jobs()
    run_started(JobAttempt.objects.get(job=job))
    return job


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_changelist_loads_for_staff(login, staff, history, model):
    response = login(staff).get(admin_url(model, "changelist"))
    assert response.status_code == 200
    assert response.context["cl"].result_count == model.objects.count() > 0


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_change_page_loads_for_staff(login, staff, history, model):
    obj = model.objects.first()
    response = login(staff).get(admin_url(model, "change", obj.pk))
    assert response.status_code == 200


@pytest.mark.parametrize("model", [Node, GPU, Image, Project], ids=lambda m: m.__name__)
def test_operators_add_nodes_gpus_images_and_projects(login, staff, model):
    assert login(staff).get(admin_url(model, "add")).status_code == 200


@pytest.mark.parametrize("query", ["node-a", "owner"])
def test_changelist_search_works(login, staff, history, query):
    assert login(staff).get(admin_url(TrainingJob, "changelist"), {"q": query}).status_code == 200
    assert login(staff).get(admin_url(Node, "changelist"), {"q": query}).status_code == 200


def test_the_node_page_shows_its_gpus_inline(login, staff, history):
    node = Node.objects.get(name="node-a")
    html = login(staff).get(admin_url(Node, "change", node.pk)).content.decode()
    assert "gpus-TOTAL_FORMS" in html
    assert 'name="gpus-0-healthy"' in html


def test_the_job_page_shows_attempts_and_events_read_only(login, staff, history):
    html = login(staff).get(admin_url(TrainingJob, "change", history.pk)).content.decode()
    assert "attempts-TOTAL_FORMS" in html and "events-TOTAL_FORMS" in html
    assert "job created" in html
    assert 'name="events-0-reason"' not in html
    assert 'name="attempts-0-cause"' not in html


def test_the_project_page_edits_members_side_by_side(login, staff, project):
    html = login(staff).get(admin_url(Project, "change", project.pk)).content.decode()
    assert "selectfilter" in html  # filter_horizontal


@pytest.mark.parametrize("who", ["owner", "teammate", "outsider"])
def test_non_staff_users_are_kept_out_of_the_admin(request, login, who):
    response = login(request.getfixturevalue(who)).get(admin_url(TrainingJob, "changelist"))
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))
