"""The API's HTML view (DRF's browsable API) renders for a signed-in user."""

from __future__ import annotations

import pytest

from harness.api import JOBS_URL, NODES_URL, job_url

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("path", ["", "logs", "events", "attempts"])
def test_a_job_renders_as_html(api_as, owner, job, path):
    response = api_as(owner).get(job_url(job, path), HTTP_ACCEPT="text/html")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")


def test_the_job_list_renders_as_html(api_as, owner, job):
    response = api_as(owner).get(JOBS_URL, HTTP_ACCEPT="text/html")

    assert response.status_code == 200
    assert b"bert-finetune" in response.content


def test_the_node_list_renders_as_html_for_staff(api_as, staff, nodes):
    response = api_as(staff).get(NODES_URL, HTTP_ACCEPT="text/html")

    assert response.status_code == 200
    assert b"node-a" in response.content
