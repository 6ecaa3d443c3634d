"""A job past its log cap keeps running; its lines are counted and dropped behind a marker."""
from __future__ import annotations

import pytest
from django.utils import timezone

from jobs.statuses import JobStatus
from logs.models import LogLine, LogVolume
from logs.services import RawLine, ingest_lines

pytestmark = pytest.mark.django_db

CHATTY = "python -c \"import pathlib, os\nfor i in range(3000): print('line', i, flush=True)\npathlib.Path(os.environ['OUTPUT_DIR'], 'done').write_text('ok')\""


def texts(job) -> list[str]:
    return list(LogLine.objects.filter(job=job).order_by("seq").values_list("text", flat=True))


def test_a_job_past_its_log_cap_keeps_running_and_its_log_ends_with_the_marker(make_job, drive, settings):
    settings.LOG_MAX_LINES_PER_JOB = 1000
    job = drive(make_job(command=CHATTY, gpus_per_node=0), JobStatus.COMPLETED)
    lines = texts(job)
    assert len(lines) == 1001
    assert lines[:2] == ["line 0", "line 1"] and lines[999] == "line 999"
    assert lines[-1] == (
        "[log cap] this job stored its limit of 1,000 log lines (LOG_MAX_LINES_PER_JOB); "
        "later lines are counted and dropped (2,000 so far); the run goes on"
    )
    volume = LogVolume.objects.get(job=job)
    assert (volume.lines, volume.dropped) == (1001, 2000)
    # The run went on past the cap: it wrote its file after the last line.
    from jobs.services.paths import output_dir_of

    assert (output_dir_of(job) / "done").read_text() == "ok"


def test_lines_delivered_again_past_the_cap_are_counted_once(make_job, settings):
    settings.LOG_MAX_LINES_PER_JOB = 3
    job = make_job()
    now = timezone.now()
    batch = [RawLine(i, now, f"l{i}") for i in range(1, 7)]
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch)
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch)
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=[RawLine(7, now, "l7")])
    assert texts(job)[:3] == ["l1", "l2", "l3"]
    assert texts(job)[3].endswith("later lines are counted and dropped (4 so far); the run goes on")
    assert LogVolume.objects.get(job=job).dropped == 4
