"""The embedded console (``manage.py runconsole``: one SQLite file) under a minute of concurrent
writers: bursts of job creations through the API, the control round placing them, the embedded
agent starting, reporting and ending their runs, each run's log flood being stored, the health
monitor's readings and the pages' reads. Nothing is refused: no "database is locked" (or "table
is locked") in the console's log, every job Completed and every line of every log stored once."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.slow  # a live console's own SQLite file, whatever the lane's database

OWNER = ("writer", "writer-pass-1")
MINUTE = 60.0
BURST = 4  # jobs created at once, every BURST_EVERY seconds
BURST_EVERY = 8.0
LINES = 3000  # each job's log flood
FLOOD = f"python -c \"import sys; [print(f'flood line {{i}}') for i in range({LINES})]\""


def test_a_minute_of_api_bursts_runs_and_log_floods_on_one_sqlite_file_refuses_nothing(users):
    console = users
    log_start = console.log_path.stat().st_size
    created: list[int] = []
    started = time.monotonic()
    while time.monotonic() - started < MINUTE:
        for _ in range(BURST):
            created.append(console.create_job(OWNER[0], f"writers-{len(created)}", FLOOD)["id"])
        status, listed = console.api("GET", "/api/v1/training-jobs/?limit=50", user=OWNER[0])  # the pages' reads go on
        assert status == 200, listed
        time.sleep(BURST_EVERY)
    for job_id in created:
        job = console.wait_for_job(job_id, {"Completed", "Failed", "Pending - internalerror"}, timeout=240)
        assert job["status"] == "Completed", job
    counts = console.shell_json(
        f"""
import json
from django.db.models import Count
from logs.models import LogLine
rows = LogLine.objects.filter(job_id__in={created!r}, text__startswith="flood line ").values("job_id").annotate(n=Count("id"), seqs=Count("seq", distinct=True))
print(json.dumps([[row["job_id"], row["n"], row["seqs"]] for row in rows]))
"""
    )
    assert sorted(counts) == sorted([job_id, LINES, LINES] for job_id in created)
    written = console.log_path.read_bytes()[log_start:].decode(errors="replace")
    assert "is locked" not in written, written[-4000:]
    assert "Traceback" not in written, written[-4000:]
    assert len(created) >= 7 * BURST, json.dumps(created)
