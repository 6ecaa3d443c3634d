"""A job past its log cap keeps running, and its log keeps its end: the first lines (the platform's
own not counted), a marker saying how many lines were dropped, then each stream's last lines, a
rolling window whose seqs stay in order. A job that prints past the cap and then raises has its
traceback in its log's tail, its search and its download, and quoted in its reason."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from agent import runfiles
from harness.api import job_url
from harness.job_factory import job_output
from jobs.statuses import JobStatus
from logs.models import LogLine, LogVolume
from logs.queries import last_lines
from logs.services import PLATFORM_PREFIXES, RawLine, cap_marker, ingest_lines

pytestmark = pytest.mark.django_db

CHATTY = "python -c \"import pathlib, os\nfor i in range(3000): print('line', i, flush=True)\npathlib.Path(os.environ['OUTPUT_DIR'], 'done').write_text('ok')\""
RAISES = "python -c \"for i in range(3000): print('line', i)\nraise ValueError('bad batch at step 2999')\""
PREAMBLE = [
    "[console] pull: Copying blob sha256:0123",
    "[console] image python:3.11 pulled (sha256:0123)",
    "[INFO] Concurrent Checkpoint library is installed (/opt/ckptlib)",
    "[console] environment ready: starting the command",
]


def texts(job, stream: str = "master") -> list[str]:
    return list(LogLine.objects.filter(job=job, stream=stream).order_by("seq").values_list("text", flat=True))


def seqs(job, stream: str = "master") -> list[int]:
    return list(LogLine.objects.filter(job=job, stream=stream).order_by("seq").values_list("seq", flat=True))


def ingest(job, numbers, *, attempt: int = 1, stream: str = "master", text=lambda n: f"l{n}") -> list[dict]:
    now = timezone.now()
    return ingest_lines(job_id=job.pk, stream=stream, attempt=attempt, lines=[RawLine(n, now, text(n)) for n in numbers])


def preamble_of(lines: list[str]) -> int:
    return sum(1 for line in lines[:64] if line.startswith(PLATFORM_PREFIXES))


def test_past_the_cap_each_stream_keeps_its_last_lines_after_a_marker_with_the_count(make_job, settings):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 10, 4
    job = make_job()
    stored = ingest(job, range(1, 15))
    assert [line["text"] for line in stored] == [f"l{n}" for n in range(1, 11)] + [cap_marker(10, 0, 4, 4)] + [f"l{n}" for n in range(11, 15)]
    # Later batches roll the tail: its oldest rows go, new ones take the next seqs.
    for start in range(15, 40, 5):
        ingest(job, range(start, start + 5))
    assert texts(job) == [f"l{n}" for n in range(1, 11)] + [cap_marker(10, 25, 4, 4)] + [f"l{n}" for n in range(36, 40)]
    assert (
        texts(job)[10]
        == "[log cap] 25 lines dropped here (LOG_MAX_LINES_PER_JOB: a job's log keeps its first 10 lines, then each stream's last 4, LOG_TAIL_LINES); the last 4 follow"
    )
    # Seqs stay in order (the viewer and search read by them): the head's and the marker's, then
    # the tail's, each batch's rows after the last one's.
    assert seqs(job) == [*range(1, 12), 32, 33, 34, 35]
    volume = LogVolume.objects.get(job=job)
    assert (volume.lines, volume.head, volume.dropped) == (15, 10, 25)
    # What the failover verdict reads is the run's end.
    assert last_lines(job.pk, attempt=1, count=3) == ["l37", "l38", "l39"]


def test_the_platforms_own_lines_do_not_count_against_the_cap(make_job, settings):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 5, 10
    job = make_job()
    ingest(job, range(1, 10), text=lambda n: PREAMBLE[n - 1] if n <= len(PREAMBLE) else f"l{n}")
    assert texts(job) == PREAMBLE + [f"l{n}" for n in range(5, 10)]
    assert LogVolume.objects.get(job=job).head == 5
    # The next attempt's preamble is not counted either; its command's first line is past the cap.
    ingest(job, range(1, 6), attempt=2, text=lambda n: PREAMBLE[n - 1] if n <= len(PREAMBLE) else f"l{n}")
    assert texts(job)[9:] == [*PREAMBLE, cap_marker(5, 0, 10, 1), "l5"]
    # A job's own line that looks like the platform's counts once past the first lines of its run.
    job2 = make_job()
    ingest(job2, range(100, 107), text=lambda n: "[console] mine")
    assert LogVolume.objects.get(job=job2).head == 5 and texts(job2)[5].startswith("[log cap]")


def test_lines_the_runner_dropped_and_lines_delivered_again_are_counted_once(make_job, settings):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 3, 2
    job = make_job()
    batch = [RawLine(i, timezone.now(), f"l{i}") for i in range(1, 7)]
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch)
    assert ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=batch) == []
    assert texts(job) == ["l1", "l2", "l3", cap_marker(3, 1, 2, 2), "l5", "l6"]
    # The node's runner dropped lines 7 to 19 (its own marker says so in its file): their numbers
    # count as dropped here once the tail has moved past them.
    ingest(job, [20])
    assert texts(job) == ["l1", "l2", "l3", cap_marker(3, 2, 2, 2), "l6", "l20"]
    ingest(job, [21, 22])
    assert texts(job) == ["l1", "l2", "l3", cap_marker(3, 17, 2, 2), "l21", "l22"]
    assert LogVolume.objects.get(job=job).dropped == 17


def test_later_attempts_and_other_streams_past_the_cap_roll_their_own_tails(make_job, settings):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 4, 3
    job = make_job()
    ingest(job, range(1, 4))
    ingest(job, range(1, 3), stream="worker-1")  # the job's cap is reached here
    ingest(job, range(4, 8))
    ingest(job, range(1, 3), attempt=2)
    ingest(job, range(3, 6), stream="worker-1")
    master = list(LogLine.objects.filter(job=job, stream="master").order_by("seq").values_list("attempt", "text"))
    assert master == [(1, "l1"), (1, "l2"), (1, "l3"), (1, cap_marker(4, 3, 3, 3)), (1, "l7"), (2, "l1"), (2, "l2")]
    worker = list(LogLine.objects.filter(job=job, stream="worker-1").order_by("seq").values_list("text", flat=True))
    assert worker == ["l1", cap_marker(4, 1, 3, 3), "l3", "l4", "l5"]
    assert seqs(job) == sorted(seqs(job)) and seqs(job, "worker-1") == [1, 2, 4, 5, 6]
    assert LogVolume.objects.get(job=job).dropped == 3 + 1
    # A late batch of attempt 1 past the cap (its node's agent back) is counted and dropped.
    ingest(job, range(8, 10))
    assert texts(job)[3] == cap_marker(4, 5, 3, 3) and LogVolume.objects.get(job=job).dropped == 5 + 1


def test_with_no_tail_lines_past_the_cap_are_counted_and_dropped(make_job, settings):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 2, 0
    job = make_job()
    ingest(job, range(1, 6))
    ingest(job, range(6, 8))
    assert texts(job) == [
        "l1",
        "l2",
        "[log cap] 5 lines dropped here (LOG_MAX_LINES_PER_JOB: a job's log keeps its first 2 lines; LOG_TAIL_LINES is 0: no last lines); the run goes on",
    ]


def test_a_job_past_its_log_cap_keeps_running_and_its_log_keeps_its_end(make_job, drive, settings):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 1000, 100
    job = drive(make_job(command=CHATTY, gpus_per_node=0), JobStatus.COMPLETED)
    lines = texts(job)
    preamble = preamble_of(lines)  # the platform's lines while the run is prepared: not counted
    assert preamble >= 3 and len(lines) == preamble + 1000 + 1 + 100
    assert lines[preamble : preamble + 2] == ["line 0", "line 1"] and lines[preamble + 999] == "line 999"
    assert lines[preamble + 1000] == cap_marker(1000, 1900, 100, 100)
    assert lines[-100:] == [f"line {i}" for i in range(2900, 3000)]
    volume = LogVolume.objects.get(job=job)
    assert (volume.lines, volume.head, volume.dropped) == (len(lines), 1000, 1900)
    # The node's own file kept its head, then (written when the run ended) its last lines.
    from agent.processes import run_dir
    from jobs.models import AttemptNode

    records = [json.loads(raw) for raw in (run_dir(AttemptNode.objects.get(attempt__job=job)) / runfiles.OUTPUT_FILE).read_text().splitlines()]
    said = [r["s"] for r in records[preamble:]]  # the runner keeps the job's LOG_TAIL_LINES too
    assert said[:1000] == [f"line {i}" for i in range(1000)] and said[-100:] == [f"line {i}" for i in range(2900, 3000)]
    assert len(said) == 1101 and said[1000].startswith("[log cap] 1,900 lines of this run dropped here")
    # The run went on past the cap: it wrote its file after the last line.
    from jobs.services.paths import output_dir_of

    assert (output_dir_of(job) / "done").read_text() == "ok"


def test_a_job_that_prints_past_the_cap_then_raises_keeps_its_traceback_in_its_log_search_download_and_reason(make_job, drive, settings, owner_api):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 2000, 200
    job = drive(make_job(command=RAISES), JobStatus.INTERNAL_ERROR)
    lines = texts(job)
    preamble = preamble_of(lines)
    assert len(lines) == preamble + 2000 + 1 + 200
    assert lines[preamble + 2000].startswith("[log cap] 803 lines dropped here") and lines[preamble + 2000].endswith("the last 200 follow")
    assert lines[-3:] == ["Traceback (most recent call last):", '  File "<string>", line 2, in <module>', "ValueError: bad batch at step 2999"]
    assert lines[-4] == "line 2999" and job_output(job)[-4] == "line 2999"
    # Found by the log search, in the download, and quoted in the job's reason.
    found = owner_api.get(job_url(job, "logs") + "?q=ValueError").json()["lines"]
    assert [line["text"] for line in found] == ["ValueError: bad batch at step 2999"]
    download = owner_api.get(f"/api/v1/training-jobs/{job.pk}/logs/download/?stream=master")
    assert download.status_code == 200
    text = b"".join(download.streaming_content).decode()
    assert text.endswith("ValueError: bad batch at step 2999\n") and "[log cap] 803 lines dropped here" in text and "\nline 0\n" in text
    assert "ValueError: bad batch at step 2999" in job.status_reason and "read the logs" in job.status_reason


def test_a_stream_capped_before_tails_were_kept_starts_its_tail_at_its_next_lines(make_job, settings):
    settings.LOG_MAX_LINES_PER_JOB, settings.LOG_TAIL_LINES = 3, 2
    job = make_job()
    ingest(job, range(1, 5))
    LogLine.objects.filter(job=job, seq__gt=4).delete()  # as the old cap left it: the marker last
    LogVolume.objects.filter(job=job).update(tails={}, lines=4)
    ingest(job, range(5, 9))
    assert texts(job) == ["l1", "l2", "l3", cap_marker(3, 2, 2, 2), "l7", "l8"]
    assert seqs(job) == [1, 2, 3, 4, 5, 6]
