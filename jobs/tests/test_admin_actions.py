"""Admin actions: cordon and uncordon nodes; stop and delete jobs through the lifecycle services."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.pages import put_in_status, shows
from jobs.models import Node, TrainingJob
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


def run_action(client, changelist: str, action: str, pks):
    return client.post(reverse(changelist), {"action": action, "_selected_action": [str(pk) for pk in pks]}, follow=True)


def test_cordon_and_uncordon_selected_nodes(login, staff, nodes):
    client = login(staff)
    a, b, _c = (Node.objects.get(name=n) for n in ("node-a", "node-b", "node-c"))
    response = run_action(client, "admin:jobs_node_changelist", "cordon", [a.pk, b.pk])
    assert response.status_code == 200
    assert "Cordoned 2 nodes." in response.content.decode()
    assert set(Node.objects.filter(cordoned=True).values_list("name", flat=True)) == {"node-a", "node-b"}

    response = run_action(client, "admin:jobs_node_changelist", "uncordon", [a.pk])
    assert "Uncordoned 1 node." in response.content.decode()
    assert list(Node.objects.filter(cordoned=True).values_list("name", flat=True)) == ["node-b"]


def test_the_node_list_shows_the_operator_columns(login, staff, nodes):
    html = login(staff).get(reverse("admin:jobs_node_changelist")).content.decode()
    for column in ("GPU model", "State", "Healthy", "Cordoned", "Simulated", "Last heartbeat"):
        assert column in html, column


def test_stop_selected_jobs_goes_through_the_lifecycle(login, staff, make_job):
    running = put_in_status(make_job(name="running"), JobStatus.RUNNING)
    done = put_in_status(make_job(name="done"), JobStatus.COMPLETED)
    response = run_action(login(staff), "admin:jobs_trainingjob_changelist", "stop_jobs", [running.pk, done.pk])
    html = response.content.decode()
    assert "Stop requested for 1 job: running." in html
    assert shows(html, "Not stopped done: A job that is Completed cannot be stopped.")
    running.refresh_from_db()
    assert running.status == JobStatus.STOPPING
    assert running.events.filter(to_status=JobStatus.STOPPING, actor="operator").exists()


def test_delete_selected_jobs_only_deletes_finished_ones(login, staff, make_job):
    running = put_in_status(make_job(name="running"), JobStatus.RUNNING)
    done = put_in_status(make_job(name="done"), JobStatus.FAILED)
    response = run_action(login(staff), "admin:jobs_trainingjob_changelist", "delete_finished_jobs", [running.pk, done.pk])
    html = response.content.decode()
    assert "Deleted 1 job: done." in html
    assert shows(html, "Not deleted running: A job that is Running cannot be deleted; stop it first.")
    assert list(TrainingJob.objects.values_list("name", flat=True)) == ["running"]


def test_djangos_unchecked_bulk_delete_is_not_offered_for_jobs(login, staff, make_job):
    make_job()
    html = login(staff).get(reverse("admin:jobs_trainingjob_changelist")).content.decode()
    assert 'value="delete_selected"' not in html
    assert 'value="delete_finished_jobs"' in html
