"""Stopping runs: SIGTERM to the process group, SIGKILL after the grace period, max run time."""

from __future__ import annotations

import os
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from agent import runfiles
from agent.processes import run_dir
from jobs.models import JobAttempt, JobEvent, TrainingJob
from jobs.services.actions import JobActionRefused, request_stop
from jobs.statuses import JobStatus
from logs.models import LogLine

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SLEEPER = "python -c \"import time; print('started', flush=True); time.sleep(600)\""
STUBBORN = (
    "python -c \"import signal, time; signal.signal(signal.SIGTERM, lambda *a: print('ignoring SIGTERM', flush=True)); "
    "print('started', flush=True); time.sleep(600)\""
)


def wait_for_line(job, text: str, drive_round, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not LogLine.objects.filter(job=job, text=text).exists():
        assert time.monotonic() < deadline, f"no line {text!r}"
        drive_round()
        time.sleep(0.1)


@pytest.fixture
def one_round(agent):
    from agent.loop import embedded_round

    return lambda: embedded_round(agent)


def test_stopping_a_running_job_terminates_its_process_group_and_ends_stopped(make_job, drive, one_round, owner):
    job = drive(make_job(command=SLEEPER), JobStatus.RUNNING)
    wait_for_line(job, "started", one_round)
    assert request_stop(job, actor="owner") == JobStatus.STOPPING
    job = drive(job, JobStatus.STOPPED, timeout=30)
    attempt = JobAttempt.objects.get(job=job)
    assert attempt.exit_signal == 15  # SIGTERM
    assert job.status_reason == "stopped by user; killed by SIGTERM"
    assert list(JobEvent.objects.filter(job=job).status_changes().values_list("to_status", "actor")) == [
        ("Pending", "owner"),
        ("Running", "node-agent"),
        ("Stopping", "owner"),
        ("Stopped", "node-agent"),
    ]


def test_a_run_that_ignores_sigterm_is_killed_after_the_grace_period(make_job, drive, one_round, settings, agent):
    settings.STOP_GRACE_PERIOD = 1.0
    job = drive(make_job(command=STUBBORN), JobStatus.RUNNING)
    wait_for_line(job, "started", one_round)
    request_stop(job, actor="owner")
    job = drive(job, JobStatus.STOPPED, timeout=30)
    assert JobAttempt.objects.get(job=job).exit_signal == 9  # SIGKILL
    assert LogLine.objects.filter(job=job, text="ignoring SIGTERM").exists()


def test_a_pending_job_stops_at_once_and_frees_what_it_held(make_job, nodes):
    job = make_job(gpus_per_node=4, node_count=3)
    TrainingJob.objects.filter(pk=job.pk).update(gpus_per_node=64)  # queued before the cluster shrank: it waits
    assert request_stop(job, actor="owner") == JobStatus.STOPPED
    job.refresh_from_db()
    assert job.status == JobStatus.STOPPED and job.finished_at


def test_a_finished_job_cannot_be_stopped(make_job, drive):
    job = drive(make_job(), JobStatus.COMPLETED)
    with pytest.raises(JobActionRefused, match="Completed cannot be stopped"):
        request_stop(job, actor="owner")


def test_a_job_past_its_max_run_time_is_stopped_with_the_reason(make_job, drive, one_round):
    job = drive(make_job(command=SLEEPER, max_run_minutes=1), JobStatus.RUNNING)
    wait_for_line(job, "started", one_round)
    TrainingJob.objects.filter(pk=job.pk).update(started_at=timezone.now() - timedelta(minutes=2))
    job = drive(job, JobStatus.STOPPED, timeout=30)
    assert job.status_reason.startswith("max run time of 1 min exceeded")
    assert JobEvent.objects.filter(job=job, to_status="Stopping", reason="max run time of 1 min exceeded").exists()


def test_the_process_is_gone_after_stop(make_job, drive, one_round):
    job = drive(make_job(command=SLEEPER), JobStatus.RUNNING)
    wait_for_line(job, "started", one_round)
    part = JobAttempt.objects.get(job=job).placements.get()
    pgid = runfiles.read_pid(run_dir(part)).pgid
    request_stop(job, actor="owner")
    drive(job, JobStatus.STOPPED)
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
