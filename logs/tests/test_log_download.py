from __future__ import annotations

from datetime import UTC, datetime

import pytest
from rest_framework.test import APIClient

from logs.models import LogLine
from logs.services import RawLine, ingest_lines

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def test_the_download_equals_the_stored_stream_byte_for_byte(make_job, owner):
    job = make_job()
    texts = [f"line {i} ünïcode \ufffd" for i in range(12_345)] + ["", "last"]
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=[RawLine(i + 1, NOW, t) for i, t in enumerate(texts)])
    ingest_lines(job_id=job.pk, stream="worker-1", attempt=1, lines=[RawLine(1, NOW, "other stream")])
    client = APIClient()
    client.force_authenticate(owner)
    response = client.get(f"/api/v1/training-jobs/{job.pk}/logs/download/?stream=master")
    assert response.status_code == 200
    assert response.streaming
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert f'filename="{job.name}-master.log"' in response["Content-Disposition"]
    body = b"".join(response.streaming_content)
    stored = "".join(t + "\n" for t in LogLine.objects.filter(job=job, stream="master").order_by("seq").values_list("text", flat=True))
    assert body == stored.encode("utf-8")
    assert body.decode().splitlines() == texts


def test_download_access_and_bad_input(make_job, teammate, outsider):
    job = make_job()
    client = APIClient()
    client.force_authenticate(teammate)
    assert client.get(f"/api/v1/training-jobs/{job.pk}/logs/download/").status_code == 200
    assert client.get(f"/api/v1/training-jobs/{job.pk}/logs/download/?stream=x;rm").status_code == 400
    client.force_authenticate(outsider)
    assert client.get(f"/api/v1/training-jobs/{job.pk}/logs/download/").status_code == 404
    client.force_authenticate(None)
    assert client.get(f"/api/v1/training-jobs/{job.pk}/logs/download/").status_code in (401, 403)
