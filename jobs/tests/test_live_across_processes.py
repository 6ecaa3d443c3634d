"""The embedded default (SQLite, the in-memory channel layer): a status changed by another process
(``manage.py job stop`` in a terminal) reaches the pages already open on the console server
without a reconnect, through the server's local relay socket; junk on that socket changes nothing."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import stat
import time
from pathlib import Path

import pytest

from jobs.live_relay import MAX_NOTICE_BYTES, SOCKET_NAME
from jobs.tests.test_live_relay import talk

pytestmark = pytest.mark.slow

SLEEPER = "python -c \"import time\nprint('started', flush=True)\nwhile True: time.sleep(0.2)\""


class PageSocket:
    """The live socket a job's page (``?job=<id>``) or the job list opens, signed in by token."""

    def __init__(self, console, token: str, query: str = "") -> None:
        self.url = f"ws://127.0.0.1:{console.port}/ws/training-jobs/{query}"
        self.token = token
        self.messages: list[dict] = []

    async def __aenter__(self) -> PageSocket:
        import websockets

        self.ws = await websockets.connect(self.url, additional_headers={"Authorization": f"Token {self.token}"})
        assert json.loads(await asyncio.wait_for(self.ws.recv(), 30))["type"] == "ready"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.ws.close()

    async def until(self, wanted, what: str, timeout: float = 60.0) -> dict:
        """Read messages until one satisfies ``wanted``; every message read is kept."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what}; got {self.messages}")
            try:
                message = json.loads(await asyncio.wait_for(self.ws.recv(), left))
            except TimeoutError:
                continue
            self.messages.append(message)
            if wanted(message):
                return message


def run_apart(coroutine):
    """Run a scenario on its own thread's event loop: the browser tests' Playwright keeps an event
    loop running on the test thread for the whole session, where ``asyncio.run`` refuses."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def status_change(job_id: int, from_status: str):
    return lambda m: m.get("type") == "job" and m["job"]["id"] == job_id and m.get("from") == from_status


def junk_lines(job_id: int) -> list[bytes]:
    """Bad JSON, not an object, a group no page listens to, and messages for the job's own page
    that are not a job.* / log.* message (a "websocket.*" one would act as the page's client)."""
    notices = [
        {"group": "admins", "message": {"type": "job.status", "job": job_id}},
        {"group": f"job-{job_id}", "message": {"type": "websocket.disconnect", "code": 1000}},
        {"group": f"job-{job_id}", "message": {"type": "websocket.receive", "text": "{}"}},
        {"group": f"job-{job_id}", "message": "job.status"},
    ]
    return [b"not json at all\n", b"[1, 2, 3]\n", *(json.dumps(n).encode() + b"\n" for n in notices)]


def test_a_status_changed_by_manage_py_reaches_the_open_job_page_and_list_without_a_reconnect(live_console):
    token = live_console.create_user("relay-owner", "owner-pass-1")
    job_id = live_console.create_job("relay-owner", "stopped-from-a-terminal", SLEEPER)["id"]
    live_console.wait_for_job(job_id, "Running", timeout=90)

    async def scenario() -> tuple[dict, dict, PageSocket]:
        async with PageSocket(live_console, token, f"?job={job_id}") as page, PageSocket(live_console, token) as listing:
            stdout = await asyncio.to_thread(live_console.manage, "job", "stop", str(job_id), "--reason", "maintenance window")
            assert stdout.strip() == f"Job {job_id} (stopped-from-a-terminal) is Stopping."
            # Only the manage.py process published Running → Stopping; the server's agent then
            # ends the run and publishes Stopping → Stopped itself.
            on_page = await page.until(status_change(job_id, "Running"), "Running → Stopping on the job's page")
            on_list = await listing.until(status_change(job_id, "Running"), "Running → Stopping on the list")
            await page.until(status_change(job_id, "Stopping"), "Stopping → Stopped on the job's page")
            return on_page, on_list, page

    on_page, on_list, page = run_apart(scenario())
    assert on_page["job"]["reason"] == on_list["job"]["reason"] == "maintenance window"
    assert page.messages[-1]["job"]["status"] == "Stopped"
    events = live_console.shell_json(
        f"import json; from jobs.models import JobEvent; "
        f"print(json.dumps(list(JobEvent.objects.filter(job_id={job_id}).status_changes().values_list('to_status', 'actor'))))"
    )
    assert [to for to, _ in events] == ["Pending", "Running", "Stopping", "Stopped"]
    assert events[2][1].endswith("(manage.py job)")


def test_the_relay_socket_is_the_console_users_alone_and_drops_junk_while_it_keeps_serving(live_console):
    path = Path(live_console.env["CONSOLE_VAR_DIR"]) / SOCKET_NAME
    info = os.stat(path)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert info.st_uid == os.getuid()

    token = live_console.create_user("relay-junk", "owner-pass-1")
    job_id = live_console.create_job("relay-junk", "junk-then-stop", SLEEPER)["id"]
    live_console.wait_for_job(job_id, "Running", timeout=90)

    async def scenario() -> PageSocket:
        async with PageSocket(live_console, token, f"?job={job_id}") as page:
            answers = await asyncio.to_thread(talk, path, b"".join(junk_lines(job_id)))
            assert len(answers) == len(junk_lines(job_id)) and all(a.startswith("error: ") for a in answers), answers
            # A line over the cap ends its connection; the server goes on.
            huge = json.dumps({"group": f"job-{job_id}", "message": {"type": "job.status", "pad": "x" * MAX_NOTICE_BYTES}}).encode() + b"\n"
            answers = await asyncio.to_thread(talk, path, huge)
            assert answers == [f"error: a line over {MAX_NOTICE_BYTES} bytes; connection closed"]
            await asyncio.to_thread(live_console.manage, "job", "stop", str(job_id))
            await page.until(status_change(job_id, "Running"), "the stop after the junk")
            return page

    page = run_apart(scenario())
    # Nothing the junk said reached the page: the ready message aside, only the real change.
    assert [m["type"] for m in page.messages] == ["job"]
    assert live_console.serving()
    assert "live relay: dropped a notice" in live_console.server_log(200_000)


def test_the_terminal_gets_a_one_line_error_for_a_missing_or_finished_job(live_console):
    import subprocess
    import sys

    from harness.processes import ROOT

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "manage.py", "job", *args], check=False, cwd=ROOT, env=live_console.env, capture_output=True, text=True, timeout=120
        )

    missing = run("stop", "987654321")
    assert missing.returncode == 1
    assert missing.stderr.strip().splitlines()[-1] == "CommandError: No training job with id 987654321."
    assert "Traceback" not in missing.stderr
    bad = run("show", "seven")
    assert bad.returncode == 2 and "'seven' is not a job id" in bad.stderr and "Traceback" not in bad.stderr
