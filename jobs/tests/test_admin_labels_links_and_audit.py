"""The admin reads as English, links each job to its console page, and keeps the audit log."""

from __future__ import annotations

import pytest
from django.urls import reverse

from jobs.models import GPU, AttemptNode, JobAttempt, JobEvent, TrainingJob
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import run_started
from notify.models import Delivery

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(nodes, make_job):
    job = make_job(name="bert-admin", gpus_per_node=2)
    place_waiting_jobs()
    run_started(JobAttempt.objects.get(job=job))
    return job


def admin_url(model, view: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{view}", args=args)


def test_the_index_says_deliveries_not_deliverys(login, staff):
    html = login(staff).get(reverse("admin:index")).content.decode()
    assert "Deliveries" in html and "Deliverys" not in html
    assert Delivery._meta.verbose_name_plural == "deliveries"


def test_a_gpu_held_by_a_run_names_the_attempt_and_node_not_an_object_number(login, staff, running):
    part = AttemptNode.objects.get(attempt__job=running)
    assert str(part) == f"bert-admin#1 rank 0 on {part.node.name}"
    gpu = GPU.objects.filter(allocated_to=part).first()
    html = login(staff).get(admin_url(GPU, "change", gpu.pk)).content.decode()
    assert "AttemptNode object" not in html
    assert f"bert-admin#1 rank 0 on {part.node.name}" in html


def test_operators_cannot_delete_job_events(login, staff, running):
    client = login(staff)
    event = JobEvent.objects.filter(job=running).first()
    assert client.get(admin_url(JobEvent, "delete", event.pk)).status_code == 403
    response = client.post(admin_url(JobEvent, "changelist"), {"action": "delete_selected", "_selected_action": [event.pk]})
    assert JobEvent.objects.filter(pk=event.pk).exists()
    assert response.status_code in (200, 302)
    html = client.get(admin_url(JobEvent, "changelist")).content.decode()
    assert 'value="delete_selected"' not in html


@pytest.mark.parametrize("model", [TrainingJob, JobAttempt, JobEvent, GPU], ids=lambda m: m.__name__)
def test_every_admin_list_with_a_job_links_to_its_console_page(login, staff, running, model):
    html = login(staff).get(admin_url(model, "changelist")).content.decode()
    assert f'href="{reverse("jobs:detail", args=[running.pk])}"' in html


def test_the_job_admin_page_links_to_the_console_and_shows_secret_names_only(login, staff, make_job):
    job = make_job(name="with-secret", env={"EPOCHS": "3"}, secret_env={"HF_TOKEN": "hf_admin_secret_123"})
    html = login(staff).get(admin_url(TrainingJob, "change", job.pk)).content.decode()
    assert f'href="{reverse("jobs:detail", args=[job.pk])}"' in html
    assert "HF_TOKEN=••••" in html
    assert "hf_admin_secret_123" not in html
