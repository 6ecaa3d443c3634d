"""The verdict reads a run's end whatever its log's length: past LOG_MAX_LINES_PER_JOB the log
keeps each stream's last lines (``logs.services.apply_log_cap``), so a fatal ECC line printed after
the cap fails the job over as it does in a short log, and a traceback printed after it is quoted
in the reason."""

from __future__ import annotations

import pytest
from django.utils import timezone

from failover.tests.exits import report_exit
from jobs.models import JobAttempt, JobEvent
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import run_started
from jobs.statuses import JobStatus
from logs.services import RawLine, ingest_lines

ECC_LINE = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def start(job) -> JobAttempt:
    [attempt] = [a for a in place_waiting_jobs() if a.job_id == job.pk]
    assert run_started(attempt)
    return JobAttempt.objects.get(pk=attempt.pk)


def fail_after(attempt: JobAttempt, printed: int, *last: str) -> str:
    """The run printed ``printed`` lines, then ``last``, and exited 1; the job's status then."""
    now = timezone.now()
    texts = [f"step {i} loss 0.5" for i in range(printed)] + list(last)
    for start_at in range(0, len(texts), 2000):  # as the agent delivers them: in slices
        batch = [RawLine(i + 1, now, text) for i, text in enumerate(texts[start_at : start_at + 2000], start=start_at)]
        ingest_lines(job_id=attempt.job_id, stream="master", attempt=attempt.number, lines=batch)
    return report_exit(attempt, exit_code=1, exit_signal=None)


@pytest.mark.django_db
@pytest.mark.usefixtures("no_local_agent")
@pytest.mark.parametrize("printed", [10, 5000], ids=["short log", "past the cap"])
def test_an_ecc_line_at_the_end_fails_over_and_a_traceback_is_quoted_whatever_the_logs_length(make_job, nodes, settings, printed):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 1000, 100
    job = make_job()
    attempt = start(job)
    assert fail_after(attempt, printed, ECC_LINE) == JobStatus.FAILOVER_IN_PROGRESS
    attempt.refresh_from_db()
    assert attempt.verdict == "hardware" and attempt.evidence["matched"] == ECC_LINE
    second = start(job)
    assert fail_after(second, printed, "Traceback (most recent call last):", "ValueError: bad batch") == JobStatus.INTERNAL_ERROR
    job.refresh_from_db()
    assert job.status_reason == "failover refused: ValueError: bad batch; no hardware fault found, read the logs"


CHATTY_ON_ATTEMPT_1 = (
    'python -c "import os, sys\n'
    "if os.environ['JOB_ATTEMPT'] != '1': print('attempt', os.environ['JOB_ATTEMPT'], 'ok'); sys.exit(0)\n"
    "for i in range({printed}): print('step', i, 'loss 0.5')\n"
    f"print('{ECC_LINE}')\n"
    'sys.exit(1)"'
)


@pytest.mark.slow  # a run through the local agent
@pytest.mark.django_db
@pytest.mark.usefixtures("no_run_outlives_its_test")
@pytest.mark.parametrize("printed", [10, 3000], ids=["short log", "past the cap"])
def test_a_run_that_prints_the_ecc_line_after_the_cap_fails_over_as_in_a_short_log(make_job, drive, settings, printed):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 2000, 200
    job = drive(make_job(command=CHATTY_ON_ATTEMPT_1.format(printed=printed)), JobStatus.COMPLETED, timeout=180)  # two runs and a failover
    flow = list(JobEvent.objects.filter(job=job).status_changes().order_by("id").values_list("to_status", flat=True))
    assert flow == ["Pending", "Running", "Pending - failoverinprogress", "Running", "Completed"]
    first = JobAttempt.objects.get(job=job, number=1)
    assert first.verdict == "hardware" and first.evidence["signature"] == "ecc_uncorrectable" and first.evidence["matched"] == ECC_LINE
    assert job.failover_count == 1
