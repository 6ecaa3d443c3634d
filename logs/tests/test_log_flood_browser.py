"""The log tab under a flood, in a real Chromium against a real console: with the tab open and
Follow on before the flood starts, a 199,000-line log ends with its last line in view and "Ended"
only after it — on a normal page, on a page whose CPU is throttled (a slow client) and when the
socket drops in the middle."""

from __future__ import annotations

import re

import pytest

from harness.browser import login, pass_log_sockets_through

pytestmark = pytest.mark.slow

OWNER = ("flood-owner", "owner-pass-1")
# The flood stays under the per-job cap of 200,000 stored lines (LOG_MAX_LINES_PER_JOB) with the
# platform's own lines before it (the image, the run's preparation: they count in the database).
LINES = 199_000

# Waits for the viewer to be open (the test touches `go` in the job's output directory), then
# prints LINES lines as fast as it can.
FLOOD = (
    'python -c "import os, sys, time\n'
    "go = os.path.join(os.environ['OUTPUT_DIR'], 'go')\n"
    "deadline = time.time() + 60\n"
    "while not os.path.exists(go) and time.time() < deadline: time.sleep(0.05)\n"
    f"for i in range({LINES}): print('line', i)\n"
    'sys.stdout.flush()"'
)

# Recorded in the page: whether the viewer held the log's last line when it first said "Ended".
WATCH_END = """() => {
  const root = document.querySelector('[data-log-viewer]');
  const status = root.querySelector('[data-lv-status]');
  window.__endSeen = null;
  new MutationObserver(() => {
    if (window.__endSeen === null && status.getAttribute('data-state') === 'ended') {
      const seqs = root.logViewer.loadedSeqs();
      window.__endSeen = { count: seqs.length, last: seqs.length ? seqs[seqs.length - 1] : 0 };
    }
  }).observe(status, { attributes: true, attributeFilter: ['data-state'] });
}"""


def start_flood(users, page, name: str) -> tuple[dict, int]:
    """A flooding job with its Logs tab open and following; returns the job and the seq the
    flood's last line will have."""
    login(page, users, *OWNER)
    job = users.create_job(OWNER[0], name, FLOOD)
    users.wait_for_job(job["id"], "Running", timeout=120)
    page.goto(f"{users.base_url}/training-jobs/{job['id']}/?tab=logs")
    page.locator('[data-lv-status][data-state="following"]').wait_for(timeout=30_000)
    page.evaluate(WATCH_END)
    users.shell(
        "from jobs.models import TrainingJob\n"
        "from jobs.services.paths import output_dir_of\n"
        f"(output_dir_of(TrainingJob.objects.get(pk={job['id']})) / 'go').touch()\n"
    )
    return job, LINES


def assert_whole_and_ended_last(users, page, job: dict) -> None:
    users.wait_for_job(job["id"], "Completed", timeout=240)
    page.locator('[data-lv-status][data-state="ended"]').wait_for(timeout=120_000)
    # What the database holds: the flood's last line is the stream's last line.
    status, body = users.api("GET", f"/api/v1/training-jobs/{job['id']}/logs/?before=999999999999&limit=1", user=OWNER[0])
    assert status == 200 and body["lines"], (status, body)
    last = body["lines"][-1]
    assert last["text"] == f"line {LINES - 1}", last
    seen = page.evaluate("() => window.__endSeen")
    assert seen is not None and seen["last"] == last["seq"], f"'Ended' came before the last line: {seen} vs seq {last['seq']}"
    # The last line is in view, and the lines the viewer holds are contiguous and end there.
    page.locator("[data-log-viewer] .lv-row", has=page.locator(".lv-text", has_text=re.compile(f"^line {LINES - 1}$"))).wait_for(timeout=10_000)
    held = page.evaluate("() => document.querySelector('[data-log-viewer]').logViewer.loadedSeqs()")
    assert held[-1] == last["seq"]
    assert held == list(range(held[0], held[-1] + 1)), "no gap or duplicate in the lines held"
    visible = page.eval_on_selector(
        "[data-lv-viewport]",
        """vp => { const box = vp.getBoundingClientRect();
                  return [...vp.querySelectorAll('.lv-row')].filter(r => { const b = r.getBoundingClientRect();
                      return b.bottom > box.top + 1 && b.top < box.bottom - 1; }).map(r => +r.dataset.seq); }""",
    )
    assert last["seq"] in visible, f"the last line is not in view: {visible[-3:]}"
    assert page.js_errors == []


def test_a_200000_line_flood_ends_with_its_last_line_then_ended(users, page):
    job, _ = start_flood(users, page, "flood")
    assert_whole_and_ended_last(users, page, job)


def test_the_same_on_a_slow_client(users, page):
    cdp = page.context.new_cdp_session(page)
    job, _ = start_flood(users, page, "flood-slow")
    cdp.send("Emulation.setCPUThrottlingRate", {"rate": 8})
    assert_whole_and_ended_last(users, page, job)


def test_the_same_when_the_socket_drops_in_the_middle(users, page):
    sockets = pass_log_sockets_through(page)
    job, _ = start_flood(users, page, "flood-drop")
    # Once some of the flood has arrived, the connection is lost.
    page.wait_for_function("() => document.querySelector('[data-log-viewer]').logViewer.loadedSeqs().length > 20000", timeout=120_000)
    sockets[0].close(code=1011, reason="connection lost in the test")
    assert_whole_and_ended_last(users, page, job)
    assert len(sockets) >= 2 and re.search(r"[?&]after=[1-9][0-9]*", sockets[1].url)
