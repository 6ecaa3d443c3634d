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


@pytest.mark.slow
def test_a_busy_containers_cpu_and_memory_are_its_own_not_its_supervisors(make_job, drive, agent, settings):
    """The container's processes are parented by Podman's monitor, not the run's supervisor: the
    sample counts them (its cgroup's processes and its init's tree), so a loop burning a core
    reads near 100 % (less on a loaded machine), not the supervisor's 0.4 %."""
    import time

    from agent.sampling import ResourceSampler
    from jobs.models import JobAttempt
    from logs.models import LogLine

    settings.RESOURCE_SAMPLE_INTERVAL = 0.01
    burn = "python -c \"import time\nblock = bytearray(64 << 20)\nprint('burning', flush=True)\nwhile True: pass\""
    job = make_job(command=burn, gpus_per_node=1)
    drive(job, "Running")
    deadline = time.monotonic() + 60
    while not LogLine.objects.filter(job=job, text="burning").exists():
        assert time.monotonic() < deadline, "the job never started burning"
        drive(job, "Running")
        time.sleep(0.2)
    sampler = ResourceSampler(agent)
    sampler.on_round()  # each process's CPU counts from here
    time.sleep(2.0)
    sampler.on_round()
    last = ResourceSample.objects.filter(job=job).order_by("-ts").first()
    # Alone, the loop reads ~100 %; beside CI's other lane on 2 cores, niced (RUN_NICENESS), it
    # read 49 %. Either is far from the supervisor's own 0.4 %, which the sample once reported.
    assert last is not None and last.cpu_percent >= 20, last.cpu_percent if last else None
    assert last.host_mem_mb >= 64, last.host_mem_mb
    assert JobAttempt.objects.get(job=job).state == "running"
