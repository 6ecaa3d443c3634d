"""``/metrics``: who may read it, that prometheus_client's own parser reads it, and that its
figures are the platform's (jobs, failover judgements and recovery, checkpoints, nodes)."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from jobs.models import JobAttempt, ResourceSample
from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus
from logs.models import Checkpoint

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def uncached(settings):
    settings.METRICS_CACHE_SECONDS = 0


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text) for s in family.samples}


def scrape(client) -> dict:
    answer = client.get("/metrics")
    assert answer.status_code == 200, answer.content
    assert answer["Content-Type"].startswith("text/plain; version=0.0.4")
    return samples(answer.content.decode())


def test_only_operators_or_the_metrics_token_may_read_it(client, owner, staff, settings):
    assert client.get("/metrics").status_code in (401, 403)
    client.force_login(owner)
    refused = client.get("/metrics")
    assert refused.status_code == 403 and b"Metrics are for operators" in refused.content
    client.force_login(staff)
    assert client.get("/metrics").status_code == 200
    client.logout()
    settings.METRICS_TOKEN = "scrape-secret-1"
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code in (401, 403)
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer scrape-secret-1").status_code == 200


def test_jobs_failovers_checkpoints_and_nodes_are_counted(client, staff, make_job, default_image):
    client.force_login(staff)
    before = scrape(client)
    assert before[("satrain_jobs", (("status", "Running"),))] == 0
    job = make_job()
    now = timezone.now()
    first = JobAttempt.objects.create(
        job=job,
        number=1,
        started_at=now - timedelta(seconds=30),
        ended_at=now - timedelta(seconds=12),
        verdict="hardware",
        evidence={"source": "nvml", "xid": 79, "gpu": 0},
    )
    JobAttempt.objects.create(job=job, number=2, started_at=now)
    job.__class__.objects.filter(pk=job.pk).update(created_at=now - timedelta(seconds=33))
    assert transition(job.pk, JobStatus.RUNNING, reason="placed")
    Checkpoint.objects.create(job=job, attempt=1, step=10, blocking_s=0.02, persist_s=1.5, committed_at=now)
    Checkpoint.objects.create(job=job, attempt=1, step=20, blocking_s=0.2, persist_s=3.0, committed_at=now)

    after = scrape(client)
    assert after[("satrain_jobs", (("status", "Running"),))] == 1
    assert after[("satrain_failover_judgements_total", (("cause", "xid_79"), ("verdict", "hardware")))] == 1
    assert after[("satrain_failover_recovery_seconds_count", ())] == 1
    assert after[("satrain_failover_recovery_seconds_sum", ())] == pytest.approx(12, abs=0.01)
    assert after[("satrain_failover_recovery_seconds_bucket", (("le", "10.0"),))] == 0
    assert after[("satrain_failover_recovery_seconds_bucket", (("le", "15.0"),))] == 1
    assert after[("satrain_job_queue_wait_seconds_count", ())] == 1
    assert after[("satrain_job_queue_wait_seconds_sum", ())] == pytest.approx(3, abs=0.01)
    assert after[("satrain_checkpoint_blocking_seconds_bucket", (("le", "0.05"),))] == 1
    assert after[("satrain_checkpoint_blocking_seconds_count", ())] == 2
    assert after[("satrain_checkpoint_persist_seconds_sum", ())] == pytest.approx(4.5)
    assert first.verdict == "hardware"
    # Request latency from django-prometheus's middleware is in the same exposition.
    assert any(name.startswith("django_http_requests_latency_seconds") for name, _ in after)


def test_a_running_jobs_latest_usage_sample_is_exported(client, staff, make_job):
    client.force_login(staff)
    job = make_job()
    assert transition(job.pk, JobStatus.RUNNING, reason="placed")
    now = timezone.now()
    ResourceSample.objects.create(job=job, attempt=1, ts=now - timedelta(seconds=10), gpu_util=10.0, power_w=100.0)
    ResourceSample.objects.create(job=job, attempt=1, ts=now, gpu_util=72.5, gpu_mem_mb=2048.0, power_w=310.0, cpu_percent=150.0, host_mem_mb=900.0)
    done = make_job(name="finished-one")
    ResourceSample.objects.create(job=done, attempt=1, ts=now, gpu_util=99.0)
    labels = (("job", str(job.pk)), ("name", job.name), ("project", job.project.name))
    got = scrape(client)
    assert got[("satrain_job_gpu_utilization_percent", labels)] == 72.5
    assert got[("satrain_job_gpu_power_watts", labels)] == 310.0
    assert got[("satrain_job_gpu_memory_mib", labels)] == 2048.0
    assert got[("satrain_job_cpu_percent", labels)] == 150.0
    # Only running jobs: a Pending job's sample is not a reading of anything running now.
    assert not any(name == "satrain_job_gpu_utilization_percent" and ("job", str(done.pk)) in key for name, key in got)


@pytest.mark.slow
@pytest.mark.django_db(transaction=False)
def test_a_real_failover_moves_the_counters(live_console):
    import urllib.request

    from harness.processes import wait

    def live_scrape() -> dict:
        token = live_console.tokens.get("admin") or live_console.create_user("admin", "admin-pass-1", staff=True)
        request = urllib.request.Request(f"{live_console.base_url}/metrics", headers={"Authorization": f"Token {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return samples(response.read().decode())

    hardware_xid = ("satrain_failover_judgements_total", (("cause", "xid_79"), ("verdict", "hardware")))
    before = live_scrape()
    live_console.create_user("metrics-owner", "metrics-pass-1")
    command = "python -c \"import time\nwhile True: print('step', flush=True); time.sleep(0.2)\""
    job = live_console.create_job("metrics-owner", "metrics-failover", command)
    live_console.wait_for_job(job["id"], "Running")
    placement = live_console.attempts(job["id"])[0]["placements"][0]
    try:
        live_console.inject_fault(placement["node"], gpu=placement["gpu_indices"][0], xid=79)
        wait(
            lambda: live_console.job(job["id"])["failover_count"] == 1 and live_console.job(job["id"])["status"] == "Running",
            "the job to fail over and run again",
            timeout=90,
        )
        time.sleep(live_console_cache_seconds())
        after = live_scrape()
        unhealthy = sum(
            v for (name, labels), v in after.items() if name == "satrain_gpus" and ("node", placement["node"]) in labels and ("healthy", "false") in labels
        )
        assert unhealthy >= 1, "the faulted GPU shows as unhealthy"
        assert ("satrain_node_healthy", (("cordoned", "false"), ("node", placement["node"]), ("state", "Ready"))) in after
    finally:
        live_console.api("POST", f"/api/v1/training-jobs/{job['id']}/stop/", user="metrics-owner")
        live_console.manage("clear_node", placement["node"])
    assert after.get(hardware_xid, 0) == before.get(hardware_xid, 0) + 1
    assert after[("satrain_failovers_total", ())] == before[("satrain_failovers_total", ())] + 1
    assert after[("satrain_failover_recovery_seconds_count", ())] == before[("satrain_failover_recovery_seconds_count", ())] + 1
    assert after[("satrain_log_lines_ingested_total", ())] > before.get(("satrain_log_lines_ingested_total", ()), 0)
    assert after[("satrain_jobs", (("status", "Running"),))] >= 1


def live_console_cache_seconds() -> float:
    return 5.5  # the console's METRICS_CACHE_SECONDS default: the next scrape reads afresh


def test_notification_deliveries_are_counted_by_channel_and_state(client, staff, owner, make_job):
    from notify.models import Delivery, Subscription

    client.force_login(staff)
    job = make_job()
    assert transition(job.pk, JobStatus.STOPPED, reason="stopped")
    event = job.events.get(to_status=JobStatus.STOPPED)
    hook = Subscription.objects.create(user=owner, channel="webhook", url="http://127.0.0.1:9/")
    Delivery.objects.create(subscription=hook, event=event, kind="terminal", state="failed", attempts=6)
    got = scrape(client)
    assert got[("satrain_notification_deliveries", (("channel", "webhook"), ("state", "failed")))] == 1
    assert got[("satrain_notification_tries_total", (("channel", "webhook"),))] == 6
