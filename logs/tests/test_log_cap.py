"""A job past its log cap keeps running; its lines are counted and dropped behind a marker."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from agent import runfiles
from harness.job_factory import job_output
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
    preamble = len(lines) - len(job_output(job))  # the platform's lines while the run is prepared
    assert len(lines) == 1001
    assert lines[preamble : preamble + 2] == ["line 0", "line 1"] and lines[999] == f"line {999 - preamble}"
    assert lines[-1] == (
        "[log cap] this job stored its limit of 1,000 log lines (LOG_MAX_LINES_PER_JOB); "
        f"later lines are counted and dropped ({2000 + preamble:,} so far); the run goes on"
    )
    volume = LogVolume.objects.get(job=job)
    assert (volume.lines, volume.dropped) == (1001, 2000 + preamble)
    # The node's own file stopped growing at the cap: the lines past it were only counted.
    from agent.processes import run_dir
    from jobs.models import AttemptNode

    records = (run_dir(AttemptNode.objects.get(attempt__job=job)) / runfiles.OUTPUT_FILE).read_text().splitlines()
    assert len(records) == 1000 + preamble + 2
    assert json.loads(records[-2])["s"].startswith("[console] this run's output reached the log cap of 1,000 lines")
    assert json.loads(records[-1]) | {"t": 0} == {
        "n": 3000 + preamble,
        "t": 0,
        "s": "[console] 2,000 lines of this run past the log cap of 1,000 were counted, not kept",
    }
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
