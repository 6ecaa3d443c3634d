"""Per-user cap on waiting jobs: a clear refusal from the API and the form, never a 500."""

from __future__ import annotations

import pytest
from django.urls import reverse

from harness.api import JOBS_URL
from jobs.models import TrainingJob
from jobs.services.creation import personal_project_for

pytestmark = pytest.mark.django_db


def test_a_user_past_the_waiting_cap_is_refused_with_a_clear_message(owner_api, owner, settings):
    settings.QUEUE_MAX_WAITING_PER_USER = 2
    for name in ("one", "two"):
        assert owner_api.post(JOBS_URL, {"name": name, "command": "python train.py"}, format="json").status_code == 201
    response = owner_api.post(JOBS_URL, {"name": "three", "command": "python train.py"}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"] == ("You already have 2 jobs waiting (the limit is 2 per user); wait for some to start or stop some before creating more.")
    assert not TrainingJob.objects.filter(name="three").exists()
    source = TrainingJob.objects.get(name="one")
    assert owner_api.post(f"{JOBS_URL}{source.pk}/clone/", {}, format="json").status_code == 400


def test_the_create_form_shows_the_refusal(client, owner, settings, default_image):
    settings.QUEUE_MAX_WAITING_PER_USER = 0
    client.force_login(owner)
    response = client.post(
        reverse("jobs:create"),
        {
            "name": "x",
            "project": str(personal_project_for(owner).pk),
            "job_type": "On-Demand",
            "image": default_image.reference,
            "command": "python train.py",
            "env_text": "",
            "gpus_per_node": "1",
            "node_count": "1",
            "failover_enabled": "on",
        },
    )
    assert response.status_code == 200
    assert "You already have 0 jobs waiting (the limit is 0 per user)" in response.content.decode()
