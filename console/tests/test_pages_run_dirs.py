"""The job page names the job's directories as its run sees them (``/job/output``, ``/job/work``; a
writable project volume at its own path): a node's host paths (JOB_WORK_ROOT, PROJECT_DATA_ROOT)
are shown to staff only."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.pages import put_in_status
from jobs.services.creation import personal_project_for
from jobs.services.paths import default_output_dir
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def in_containers(settings):
    settings.JOB_SANDBOX = "on"


def detail(client, job, **params) -> str:
    response = client.get(reverse("jobs:detail", args=[job.pk]), params)
    assert response.status_code == 200
    return response.content.decode()


def output_field(html: str) -> str:
    start = html.index('data-field="output_dir">')
    return html[start : html.index("</dd>", start)]


def host_roots(settings) -> tuple[str, str]:
    return str(settings.JOB_WORK_ROOT), str(settings.PROJECT_DATA_ROOT)


@pytest.mark.parametrize("tab", ["details", "logs", "checkpoints", "failover", "events"])
def test_a_regular_owner_sees_the_containers_paths_and_no_host_path(login, owner, make_job, settings, tab):
    job = put_in_status(make_job(name="own-output"), JobStatus.RUNNING)
    html = detail(login(owner), job, tab=tab)
    for root in host_roots(settings):
        assert root not in html, (tab, root)
    assert 'data-storage-names="/job/work|/job/output"' in html
    if tab == "details":
        assert output_field(html).startswith('data-field="output_dir">/job/output <span class="muted">(the job\'s own)</span>')
        assert "on the node" not in html


def test_staff_see_the_host_path_beside_the_containers(login, owner, staff, make_job, settings):
    job = put_in_status(make_job(name="own-output"), JobStatus.RUNNING)
    html = detail(login(staff), job)
    field = output_field(html)
    assert field.startswith('data-field="output_dir">/job/output ')
    assert f'<span class="muted" data-field="output_dir_on_host">on the node: {default_output_dir(job.pk)}</span>' in field
    names = html.split('data-storage-names="', 1)[1].split('"', 1)[0].split("|")
    assert names[0] == "/job/work" and str(settings.JOB_WORK_ROOT / str(job.pk) / "work") in names


def test_an_output_directory_in_the_projects_data_is_the_containers_job_output(login, owner, staff, make_job, settings):
    project = personal_project_for(owner)
    job = make_job(name="chosen", output_dir="runs/bert")
    on_host = str(settings.PROJECT_DATA_ROOT / project.name / "runs" / "bert")
    html = detail(login(owner), job)
    assert output_field(html) == 'data-field="output_dir">/job/output'
    for root in host_roots(settings):
        assert root not in html
    assert on_host in output_field(detail(login(staff), job))


def test_an_output_directory_in_a_project_volume_keeps_its_path(login, owner, staff, make_job, data_volume):
    job = make_job(name="in-volume", output_dir="/data/gpt")
    owners = detail(login(owner), job)
    assert output_field(owners) == 'data-field="output_dir">/data/gpt'
    assert 'data-storage-names="/job/work|/data/gpt"' in owners
    assert output_field(detail(login(staff), job)) == 'data-field="output_dir">/data/gpt'  # the same path: said once


def test_without_containers_the_page_names_the_host_paths_the_run_sees(login, owner, make_job, settings):
    settings.JOB_SANDBOX = "off"
    job = make_job(name="on-host")
    html = detail(login(owner), job)
    assert output_field(html).startswith(f'data-field="output_dir">{default_output_dir(job.pk)} ')
