"""GET /api/v1/training-jobs/{id}/metrics/: a job's samples for those who may see it."""

from __future__ import annotations

import pytest
from django.utils import timezone

from harness.api import JOBS_URL
from jobs.services.samples import Reading, record_readings

pytestmark = pytest.mark.django_db


def test_the_owner_gets_the_samples_and_an_outsider_gets_404(owner_api, api_as, outsider, make_job):
    job = make_job()
    record_readings(
        [
            Reading(
                job_id=job.pk, attempt=1, ts=timezone.now(), span_s=5.0, gpu_util=80.0, gpu_mem_mb=30000.0, power_w=400.0, cpu_percent=120.0, host_mem_mb=900.0
            )
        ]
    )
    body = owner_api.get(f"{JOBS_URL}{job.pk}/metrics/").json()
    assert len(body) == 1
    assert body[0]["gpu_util"] == 80.0 and body[0]["power_w"] == 400.0 and body[0]["attempt"] == 1
    assert api_as(outsider).get(f"{JOBS_URL}{job.pk}/metrics/").status_code == 404
