"""Real runs on the embedded agent: real processes, real output, real exits."""

from __future__ import annotations

import ipaddress
import json

import pytest
from django.conf import settings

from agent import runfiles
from harness.job_factory import job_output
from jobs.job_fields import EXAMPLE_COMMAND
from jobs.models import JobAttempt, JobEvent
from jobs.services.paths import default_output_dir
from jobs.statuses import JobStatus
from logs.models import Checkpoint, LogLine

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def log_texts(job, stream: str = "master") -> list[str]:
    return job_output(job, stream=stream)


def statuses(job) -> list[str]:
    return list(JobEvent.objects.filter(job=job).status_changes().order_by("id").values_list("to_status", flat=True))


def test_a_small_pytorch_training_runs_to_completed_with_its_output_captured_in_order(make_job, drive):
    job = make_job(
        command="PYTHONPATH=$CHECKPOINT_VENDOR python -m jobs.examples.train_tiny --epochs 3 --steps-per-epoch 20 --output-dir $OUTPUT_DIR",
        gpus_per_node=2,
    )
    job = drive(job, JobStatus.COMPLETED, timeout=120)
    assert statuses(job) == ["Pending", "Running", "Completed"]
    attempt = JobAttempt.objects.get(job=job)
    assert (attempt.exit_code, attempt.exit_signal, attempt.number) == (0, None, 1)
    lines = log_texts(job)
    assert lines[0] == "Starting dataset initialization"
    assert lines[1].startswith("Training for 3 epochs, 60 steps, on 0,1")
    assert [ln.split(" loss")[0] for ln in lines[2:5]] == ["epoch 1/3 step 20/60", "epoch 2/3 step 40/60", "epoch 3/3 step 60/60"]
    assert lines[-1].startswith("Training complete: final loss")
    assert list(LogLine.objects.filter(job=job).order_by("seq").values_list("seq", flat=True)) == list(range(1, LogLine.objects.filter(job=job).count() + 1))
    assert (default_output_dir(job.pk) / "model.pt").exists()
    assert job.started_at and job.finished_at and job.finished_at >= job.started_at


def test_the_forms_prefilled_job_commits_a_checkpoint_each_epoch(make_job, drive):
    job = drive(make_job(name="first-job", command=EXAMPLE_COMMAND, gpus_per_node=1), JobStatus.COMPLETED, timeout=120)
    assert list(Checkpoint.objects.filter(job=job).order_by("step").values_list("step", flat=True)) == [50, 100, 150]
    assert "DataStates checkpointing available: datastates.llm.DecoratedCheckpointing" in log_texts(job)


def test_the_run_gets_the_platform_environment(make_job, drive):
    script = (
        "import os,json; print(json.dumps({k: os.environ.get(k) for k in "
        "['CUDA_VISIBLE_DEVICES','CHECKPOINT_VENDOR','RANK','LOCAL_RANK','WORLD_SIZE','MASTER_ADDR','MASTER_PORT',"
        "'JOB_NAME','JOB_ATTEMPT','OUTPUT_DIR','MY_SETTING','SECRET_KEY','DJANGO_SETTINGS_MODULE']}))"
    )
    job = make_job(name="env-check", command=f'python -c "{script}"', gpus_per_node=3, env={"MY_SETTING": "42"})
    job = drive(job, JobStatus.COMPLETED)
    seen = json.loads(log_texts(job)[0])
    assert seen["CUDA_VISIBLE_DEVICES"] == "0,1,2"
    assert seen["CHECKPOINT_VENDOR"].endswith("ckptlib/vendor")
    # One rank: no LOCAL_RANK (as on a workstation: accelerate then starts no process group).
    assert (seen["RANK"], seen["LOCAL_RANK"], seen["WORLD_SIZE"]) == ("0", None, "1")
    # Its own address in its job network (agent.networks): rank 0's, as it is rank 0.
    assert ipaddress.ip_address(seen["MASTER_ADDR"]) in ipaddress.ip_network(settings.JOB_NETWORK_POOL) and int(seen["MASTER_PORT"]) > 0
    assert (seen["JOB_NAME"], seen["JOB_ATTEMPT"], seen["MY_SETTING"]) == ("env-check", "1", "42")
    assert seen["OUTPUT_DIR"] == "/job/output"  # in the container; on the node, the job's own directory
    assert default_output_dir(job.pk).is_dir()
    # The console's own secrets and settings never reach user code.
    assert seen["SECRET_KEY"] is None and seen["DJANGO_SETTINGS_MODULE"] is None


def test_leading_assignments_and_continued_lines_run_like_the_services_command_field(make_job, drive):
    job = make_job(command='GREETING="hello there" \\\n  python -c "import os; print(os.environ[\'GREETING\'])"')
    job = drive(job, JobStatus.COMPLETED)
    assert log_texts(job) == ["hello there"]


def test_a_failing_script_without_failover_ends_failed_with_its_traceback_captured(make_job, drive):
    job = make_job(command="python -m jobs.examples.train_tiny --epochs 3 --steps-per-epoch 5 --fail-at-epoch 2", failover_enabled=False)
    job = drive(job, JobStatus.FAILED, timeout=120)
    assert statuses(job) == ["Pending", "Running", "Failed"]
    assert job.status_reason == "exit code 1; Job Failover is off"
    text = "\n".join(log_texts(job))
    assert "Traceback (most recent call last):" in text
    assert "RuntimeError: deliberate failure at epoch 2" in text
    assert text.index("epoch 1/3") < text.index("Traceback")


def test_a_multi_node_job_runs_one_rank_per_node_into_master_and_worker_streams(make_job, drive):
    job = make_job(command="python -c \"import os; print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'])\"", node_count=2)
    job = drive(job, JobStatus.COMPLETED)
    assert log_texts(job, "master") == ["rank 0 of 2"]
    assert log_texts(job, "worker-1") == ["rank 1 of 2"]


def test_output_is_cleaned_progress_bars_collapse_bad_utf8_is_replaced_long_lines_are_cut(make_job, drive, settings):
    settings.LOG_MAX_LINE_CHARS = 50
    script = (
        "import sys; w=sys.stdout.buffer.write; "
        "w(b'progress 10%\\rprogress 50%\\rprogress 100%\\n'); "
        "w(b'bad \\xff\\xfe bytes\\n'); "
        "w(b'x'*80 + b'\\n'); sys.stdout.flush()"
    )
    job = make_job(command=f'python -c "{script}"')
    job = drive(job, JobStatus.COMPLETED)
    lines = log_texts(job)
    assert lines[0] == "progress 100%"
    assert lines[1] == "bad \ufffd\ufffd bytes"
    assert lines[2] == "x" * 50 + " …[line cut at 50 characters]"


def test_a_chatty_run_is_drained_in_slices_and_still_ends_with_every_line(make_job, drive, monkeypatch):
    monkeypatch.setattr(runfiles, "OUTPUT_READ_MAX_BYTES", 2000)
    job = make_job(command="python -c \"[print('line', i) for i in range(500)]\"")
    job = drive(job, JobStatus.COMPLETED)
    assert log_texts(job) == [f"line {i}" for i in range(500)]
