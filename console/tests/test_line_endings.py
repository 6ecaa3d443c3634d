"""Text typed in a browser arrives with CRLF line endings: every text field is stored with LF,
through the form and the API alike, so a ``VAR=value \\`` continuation keeps its variables."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.api import JOBS_URL
from jobs.job_fields import logical_lines
from jobs.models import TrainingJob
from jobs.services.creation import personal_project_for

pytestmark = pytest.mark.django_db

CRLF_COMMAND = "FOO=bar \\\r\nBAZ=qux \\\r\npython train.py --epochs 3\r\n"


def test_a_crlf_command_from_the_form_is_stored_with_lf(login, owner, default_image):
    response = login(owner).post(
        reverse("jobs:create"),
        {
            "name": "crlf-form",
            "job_type": "On-Demand",
            "image": default_image.reference,
            "command": CRLF_COMMAND,
            "env_text": "A=1\r\nB=2\r\n",
            "gpus_per_node": "1",
            "node_count": "1",
            "description": "two\r\nlines",
            "project": str(personal_project_for(owner).pk),
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    job = TrainingJob.objects.get(name="crlf-form")
    assert "\r" not in job.command and "\r" not in job.description
    assert job.command == "FOO=bar \\\nBAZ=qux \\\npython train.py --epochs 3"
    assert logical_lines(job.command) == ["FOO=bar  BAZ=qux  python train.py --epochs 3"]
    assert job.env == {"A": "1", "B": "2"}
    assert job.description == "two\nlines"


def test_a_crlf_command_through_the_api_is_stored_with_lf(owner_api):
    response = owner_api.post(
        JOBS_URL,
        {"name": "crlf-api", "command": CRLF_COMMAND, "env": {"MULTI": "a\r\nb"}, "description": "x\ry"},
        format="json",
    )
    assert response.status_code == 201, response.json()
    body = owner_api.get(f"{JOBS_URL}{response.json()['id']}/").json()
    assert body["command"] == "FOO=bar \\\nBAZ=qux \\\npython train.py --epochs 3"
    assert body["env"] == {"MULTI": "a\nb"}
    assert body["description"] == "x\ny"
