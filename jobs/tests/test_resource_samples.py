"""Resource samples are stored compactly: past MAX_SAMPLES a job's oldest samples merge pairwise
(span-weighted means, spans added) and the newest stay as sampled."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from jobs.models import ResourceSample
from jobs.services import samples
from jobs.services.samples import Reading, record_readings, samples_of

pytestmark = pytest.mark.django_db


def test_a_long_history_is_merged_and_keeps_its_mean_and_its_time_span(make_job, monkeypatch):
    monkeypatch.setattr(samples, "MAX_SAMPLES", 40)
    monkeypatch.setattr(samples, "MERGE_BATCH", 20)
    job = make_job()
    start = timezone.now() - timedelta(hours=1)
    for i in range(100):
        record_readings(
            [
                Reading(
                    job_id=job.pk,
                    attempt=1,
                    ts=start + timedelta(seconds=5 * i),
                    span_s=5.0,
                    gpu_util=float(i % 10) * 10,
                    gpu_mem_mb=1000.0,
                    power_w=None,
                    cpu_percent=50.0,
                    host_mem_mb=200.0,
                )
            ]
        )
    rows = samples_of(job.pk)
    assert len(rows) <= 40
    assert sum(r["span_s"] for r in rows) == pytest.approx(500.0)
    mean = sum(r["gpu_util"] * r["span_s"] for r in rows) / 500.0
    assert mean == pytest.approx(45.0)
    assert all(r["power_w"] is None and r["gpu_mem_mb"] == pytest.approx(1000.0) for r in rows)
    assert rows[-1]["span_s"] == 5.0  # the newest as sampled
    assert [r["ts"] for r in rows] == sorted(r["ts"] for r in rows)


def test_the_sampler_records_a_running_jobs_gpus_and_processes(make_job, drive, agent, settings):
    from agent.sampling import ResourceSampler

    settings.RESOURCE_SAMPLE_INTERVAL = 0.01
    job = make_job(command='python -c "import time; time.sleep(3)"', gpus_per_node=2)
    drive(job, "Running")
    sampler = ResourceSampler(agent)
    import time

    for _ in range(3):
        sampler.on_round()
        time.sleep(0.05)
    rows = list(ResourceSample.objects.filter(job=job))
    assert len(rows) >= 2
    last = rows[-1]
    assert 0 <= last.gpu_util <= 100 and last.gpu_mem_mb > 0 and last.power_w > 0
    assert last.host_mem_mb > 0 and last.cpu_percent is not None
    drive(job, "Completed")
