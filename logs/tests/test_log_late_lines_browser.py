"""The log tab in a real Chromium while an ended attempt's lines arrive late: the viewer, following
the tail, puts them in their attempt's place (before the next attempt's banner), each line once,
and holds what the stored stream holds."""

from __future__ import annotations

import json
import re

import pytest

from harness.browser import login

pytestmark = pytest.mark.slow

OWNER = ("late-log-owner", "owner-pass-1")
# Prints "attempt 1 step <i>" forever, a line every 0.1 s.
FOREVER = "python -c \"import os, time\ni = 0\nwhile True:\n    print('attempt', os.environ['JOB_ATTEMPT'], 'step', i, flush=True); i += 1; time.sleep(0.1)\""


def line(page, text: str):
    return page.locator("[data-log-viewer] .lv-row", has=page.locator(".lv-text", has_text=re.compile(f"^{re.escape(text)}$")))


def recording_log_sockets(page) -> list[dict]:
    """Routes the page's log sockets through to the server and records what the server sends."""
    heard: list[dict] = []

    def through(ws) -> None:
        server = ws.connect_to_server()

        def forward(message) -> None:
            heard.append(json.loads(message))
            ws.send(message)

        server.on_message(forward)

    page.route_web_socket(re.compile(r"/ws/training-jobs/[0-9]+/logs/"), through)
    return heard


def test_a_following_viewer_puts_an_ended_attempts_late_lines_in_its_place(users, page):
    heard = recording_log_sockets(page)
    login(page, users, *OWNER)
    job = users.create_job(OWNER[0], "late-lines", FOREVER)
    job_id = job["id"]
    page.goto(f"{users.base_url}/training-jobs/{job_id}/?tab=logs")
    line(page, "attempt 1 step 3").wait_for(timeout=30_000)

    # Attempt 2's first lines are stored while attempt 1's run goes on printing: from then on,
    # every line attempt 1 delivers is late and goes in before attempt 2's.
    users.shell(
        f"""
from django.utils import timezone
from logs.services import RawLine, ingest_lines
ingest_lines(job_id={job_id}, stream="master", attempt=2, lines=[RawLine(n, timezone.now(), f"attempt 2 line {{n}}") for n in range(1, 6)])
"""
    )
    line(page, "attempt 2 line 5").wait_for(timeout=30_000)
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-log-viewer] .lv-row')].some(r => /attempt 1 step (2[5-9]|[3-9][0-9])$/.test(r.innerText))",
        timeout=30_000,
    )
    users.api("POST", f"/api/v1/training-jobs/{job_id}/stop/", user=OWNER[0])
    page.locator('[data-lv-status][data-state="ended"]').wait_for(timeout=30_000)
    assert any(message["type"] == "inserted" for message in heard), "the server told the viewer of late lines"

    status, body = users.api("GET", f"/api/v1/training-jobs/{job_id}/logs/?after=0&limit=5000", user=OWNER[0])
    assert status == 200
    attempts = [ln["attempt"] for ln in body["lines"]]
    assert attempts == sorted(attempts), "attempt 1, then attempt 2"
    assert [ln["text"] for ln in body["lines"] if ln["attempt"] == 2] == [f"attempt 2 line {n}" for n in range(1, 6)]
    loaded = page.evaluate("() => document.querySelector('[data-log-viewer]').logViewer.loadedSeqs()")
    assert loaded == [ln["seq"] for ln in body["lines"]], "the viewer holds the stored stream, each line once"
    # On screen: attempt 1's last line, the banner, attempt 2's lines at the bottom.
    banner = page.locator("[data-log-viewer] .lv-banner").last
    assert banner.locator("xpath=preceding-sibling::div[1]").get_attribute("data-attempt") == "1"
    assert banner.locator("xpath=following-sibling::div[1]").get_attribute("data-attempt") == "2"
    assert page.js_errors == []
