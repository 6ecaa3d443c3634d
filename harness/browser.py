"""Browser-test harness: the real console in a subprocess and a headless Chromium driving it.

The fixtures reach a test by name (the root conftest registers this module); a test module imports
only the helpers::

    from harness.browser import login, save_screenshot

* ``live_console`` (session): ``manage.py runconsole`` on a free port with its own SQLite file,
  var dir and job work root (embedded agent, 3 simulated nodes × 4 GPUs, fast health checks and
  stop grace). The object it yields has ``base_url``, ``shell(code)`` / ``manage(*args)`` (run
  against the same database in a subprocess, returning stdout), ``create_user``, ``api`` (REST
  with the user's token), ``create_job``, ``wait_for_job``, ``insert_log_lines`` and ``wait``.
  At the end the server's process group gets SIGTERM and every run it started is killed.
* ``users`` (module): the module's ``OWNER``, ``OUTSIDER``, ``OPERATOR`` and ``ADMIN`` in it.
* ``browser`` (session): Chromium from ``/usr/bin/chromium`` (or ``$CHROMIUM_PATH``), headless.
  Missing Chromium skips the test, or fails it where ``REQUIRE_BROWSER=1`` (CI).
* ``page`` (function): a fresh context and page; at teardown a screenshot of the page goes to
  ``test-artifacts/<test>-end.png`` (``FAILED-<test>.png`` and the server log's tail on failure);
  ``page.js_errors`` lists the page's uncaught JavaScript errors.
* ``login(page, live_console, username, password)`` signs in through the login form.

Playwright's sync API must not run inside a running asyncio loop: use these fixtures from plain
(sync) tests only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.runner import kill_unfinished_runs
from harness.processes import PY, ROOT, free_port, wait

# Screenshots and failure captures; TEST_ARTIFACTS_DIR moves them (e.g. to tmp/artifacts in CI).
ARTIFACTS = Path(os.environ.get("TEST_ARTIFACTS_DIR") or ROOT / "test-artifacts")
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ADMIN_PASSWORD = "admin-pass-1"
# Where the live console runs its jobs: its own node agents ("agents"), or a one-host Slurm
# cluster ("slurm": ``make test`` runs the browser tests again so).
BACKEND = os.environ.get("BROWSER_BACKEND", "agents")


def chromium_path() -> str:
    """The Chromium binary to drive, or a skip (a failure where REQUIRE_BROWSER=1)."""
    candidates = [os.environ.get("CHROMIUM_PATH", ""), "/usr/bin/chromium", "/usr/bin/chromium-browser"]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    message = "browser tests need Chromium: apt-get install -y chromium (or set CHROMIUM_PATH)"
    if os.environ.get("REQUIRE_BROWSER") == "1":
        pytest.fail(message)
    pytest.skip(message)


class LiveConsole:
    """One console process (Daphne + embedded agent) and helpers that act on its database."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
        env.update(
            {
                "CONSOLE_VAR_DIR": str(workdir / "var"),
                "SQLITE_PATH": str(workdir / "var" / "console.sqlite3"),
                "JOB_WORK_ROOT": str(workdir / "jobs"),
                "CONSOLE_ADMIN_PASSWORD": ADMIN_PASSWORD,
                "SECRET_KEY": "browser-test-secret-key-not-for-production",
                "PORT": str(self.port),
                "SIMULATED_GPUS": "1",
                "SIMULATED_NODES": "3",
                "SIMULATED_GPUS_PER_NODE": "4",
                "STOP_GRACE_PERIOD": "3",
                "HEALTH_CHECK_INTERVAL": "1",
                "AGENT_POLL_INTERVAL": "0.2",
                "RESOURCE_SAMPLE_INTERVAL": "1",
                "LOG_LEVEL": "WARNING",
                "PYTHONUNBUFFERED": "1",
                # The webhook tests' receiver listens on 127.0.0.1, which a console refuses by default.
                "NOTIFY_WEBHOOK_ALLOW_PRIVATE": "1",
                # Every module's sign-ins (the CLI's logins, LiveConsole.token) come from one
                # address to this one shared console: its 10/min would throttle whichever module
                # runs right after another. The throttle itself: test_api_token_auth.
                "TOKEN_THROTTLE_RATE": "1000/min",
            }
        )
        self.slurm = None
        if BACKEND == "slurm":
            # The same pages on the Slurm backend: a one-host cluster whose three nodes have
            # four (fake) GPUs each, as the simulated ones.
            from harness.slurm import site_dir, site_env, slurm_missing
            from jobs.backends.slurm.cluster import LocalSlurmCluster

            reason = slurm_missing()
            if reason:
                if os.environ.get("REQUIRE_SLURM") == "1":
                    pytest.fail(reason)
                pytest.skip(reason)
            self.slurm = LocalSlurmCluster(site_dir("browser-slurm"), site=True)
            env.update({**site_env(self.slurm), "SLURM_POLL_INTERVAL": "0.5"})
        self.env = env
        self.log_path = workdir / "console.log"
        self.proc: subprocess.Popen | None = None
        self.tokens: dict[str, str] = {}

    # --- process --------------------------------------------------------------------------
    def start(self) -> None:
        (self.workdir / "var").mkdir(parents=True, exist_ok=True)
        if self.slurm is not None:
            self.slurm.start()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [PY, "manage.py", "runconsole", "--port", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait(self.serving, f"the console on {self.base_url}", timeout=90)
        except AssertionError:
            self.stop()
            raise AssertionError(f"the console did not start:\n{self.server_log()}") from None

    def serving(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"the console exited with {self.proc.returncode}:\n{self.server_log()}")
        with urllib.request.urlopen(f"{self.base_url}/login/", timeout=5) as response:
            return response.status == 200

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        self.kill_runs()
        if self.slurm is not None:
            self.slurm.stop()
            shutil.rmtree(self.slurm.root, ignore_errors=True)

    def kill_runs(self) -> None:
        """Runs live in their own sessions (they outlive a console restart): kill what is left."""
        kill_unfinished_runs(Path(self.env["JOB_WORK_ROOT"]))

    def server_log(self, chars: int = 6000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # --- Django against the same database ---------------------------------------------------
    def manage(self, *args: str, timeout: float = 120) -> str:
        """``manage.py <args>`` with the console's environment; its stdout (raises on failure)."""
        done = subprocess.run([PY, "manage.py", *args], check=False, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise AssertionError(f"manage.py {' '.join(args)[:200]} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def shell(self, code: str, timeout: float = 120) -> str:
        """Run Python ``code`` in ``manage.py shell`` against the console's database; its stdout."""
        return self.manage("shell", "--no-imports", "-v", "0", "-c", code, timeout=timeout)

    def shell_json(self, code: str) -> Any:
        """Run ``code`` that prints one JSON document as its last line; that document."""
        return json.loads(self.shell(code).strip().splitlines()[-1])

    def create_user(self, username: str, password: str, *, staff: bool = False, teammate_of: str | None = None) -> str:
        """A user (created once, password reset on later calls) with an API token; returns the token."""
        code = f"""
import json
from django.contrib.auth.models import User
from knox.models import AuthToken
user, _ = User.objects.get_or_create(username={username!r})
user.set_password({password!r}); user.is_staff = user.is_superuser = {staff!r}; user.save()
if {teammate_of!r}:
    from jobs.services.creation import personal_project_for
    personal_project_for(User.objects.get(username={teammate_of!r})).members.add(user)
print(json.dumps(AuthToken.objects.create(user)[1]))
"""
        self.tokens[username] = self.shell_json(code)
        return self.tokens[username]

    # --- REST ---------------------------------------------------------------------------------
    def api(self, method: str, path: str, *, user: str = "admin", body: dict | None = None) -> tuple[int, Any]:
        """A REST call as ``user`` (token auth): (status, decoded JSON or None)."""
        if user not in self.tokens:
            if user != "admin":
                raise KeyError(f"no token for {user}: create_user first")
            self.create_user("admin", ADMIN_PASSWORD, staff=True)
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        request.add_header("Authorization", f"Token {self.tokens[user]}")
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw = response.read()
                return response.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw) if raw else None
            except ValueError:
                return exc.code, raw.decode(errors="replace")

    def create_job(self, user: str, name: str, command: str, **fields: Any) -> dict:
        """Create a job through the API as ``user``; the job's JSON."""
        status, job = self.api("POST", "/api/v1/training-jobs/", user=user, body={"name": name, "command": command, "gpus_per_node": 1, **fields})
        assert status == 201, (status, job)
        return job

    def job(self, job_id: int, user: str = "admin") -> dict:
        status, job = self.api("GET", f"/api/v1/training-jobs/{job_id}/", user=user)
        assert status == 200, (status, job)
        return job

    def wait_for_job(self, job_id: int, statuses: str | set[str], timeout: float = 60.0) -> dict:
        wanted = {statuses} if isinstance(statuses, str) else set(statuses)
        last: dict = {}

        def reached() -> dict | None:
            last.update(self.job(job_id))
            return dict(last) if last.get("status") in wanted else None

        try:
            return wait(reached, f"job {job_id} to be {wanted}", timeout=timeout)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; it is {last.get('status')} ({last.get('status_reason')})") from None

    def attempts(self, job_id: int) -> list[dict]:
        status, body = self.api("GET", f"/api/v1/training-jobs/{job_id}/attempts/")
        assert status == 200, (status, body)
        return body["results"] if isinstance(body, dict) and "results" in body else body

    def inject_fault(self, node: str, gpu: int | None = None, xid: int = 79) -> str:
        args = ["inject_fault", node, "--xid", str(xid)]
        if gpu is not None:
            args += ["--gpu", str(gpu)]
        return self.manage(*args)

    def insert_log_lines(
        self, job_id: int, count: int, *, stream: str = "master", attempt: int = 1, text: str = "line {seq} of the stored log"
    ) -> tuple[int, int]:
        """Append ``count`` lines to a job's stream straight into the database (no publishing):
        ``text`` is formatted with ``seq`` and ``n`` (1-based within this batch). Returns the
        first and last seq written."""
        code = f"""
import json
from datetime import timedelta
from django.db import transaction
from django.db.models import Max
from django.utils import timezone
from logs.models import LogLine
with transaction.atomic():
    lines = LogLine.objects.filter(job_id={job_id}, stream={stream!r})
    seq0 = lines.aggregate(m=Max("seq"))["m"] or 0
    no0 = lines.filter(attempt={attempt}).aggregate(m=Max("line_no"))["m"] or 0
    start = timezone.now() - timedelta(seconds={count} / 1000)
    LogLine.objects.bulk_create(
        (LogLine(job_id={job_id}, stream={stream!r}, attempt={attempt}, seq=seq0 + n, line_no=no0 + n,
                 ts=start + timedelta(milliseconds=n), text={text!r}.format(seq=seq0 + n, n=n))
         for n in range(1, {count} + 1)),
        batch_size=5000,
    )
print(json.dumps([seq0 + 1, seq0 + {count}]))
"""
        first, last = self.shell_json(code)
        return first, last


@pytest.fixture(scope="session")
def live_console() -> Iterator[LiveConsole]:
    workdir = Path(tempfile.mkdtemp(prefix="console-browser-"))
    console = LiveConsole(workdir)
    console.start()
    try:
        yield console
    finally:
        console.stop()
        shutil.rmtree(workdir, ignore_errors=True)


# The module constants ``users`` creates, and whether each is staff.
USER_ROLES = (("OWNER", False), ("OUTSIDER", False), ("OPERATOR", True), ("ADMIN", True))


@pytest.fixture(scope="module")
def users(request, live_console):
    """The module's users in the shared live console, from its ``OWNER``, ``OUTSIDER`` (plain
    users), ``OPERATOR`` and ``ADMIN`` (staff) pairs of (username, password), where it has them:
    every module names its own, since the console's database is shared by all of them."""
    for constant, staff in USER_ROLES:
        pair = getattr(request.module, constant, None)
        if pair is not None:
            live_console.create_user(*pair, staff=staff)
    return live_console


@pytest.fixture(scope="session")
def browser():
    executable = chromium_path()
    from playwright.sync_api import sync_playwright

    playwright = sync_playwright().start()
    try:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)
    except Exception as exc:
        playwright.stop()
        message = f"Chromium at {executable} did not start: {exc}"
        if os.environ.get("REQUIRE_BROWSER") == "1":
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield chromium
    finally:
        chromium.close()
        playwright.stop()


def artifact_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-")[:120]


def save_screenshot(page, name: str, *, full_page: bool = False) -> Path:
    """A PNG of the page under ``test-artifacts/`` (git-ignored) or ``$TEST_ARTIFACTS_DIR``; returns its path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{artifact_name(name)}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


NETWORK_CHANGED = "net::ERR_NETWORK_CHANGED"


def load_again_when_the_network_changed(tab, refused: list[str], tries: int = 4) -> None:
    """``tab.goto`` and ``tab.reload`` load the page again when Chromium dropped one of its
    requests with ERR_NETWORK_CHANGED: it does so whenever a network interface appears or goes on
    its host, and here every job's network is a bridge on the same host (a page whose module
    script was dropped so never ran). A user's browser is not on a node."""
    for name in ("goto", "reload"):
        real = getattr(tab, name)

        def load(*args, _real=real, **kwargs):
            for _ in range(tries):
                seen = len(refused)
                response = _real(*args, **kwargs)
                # A dropped request's event may come just after the load event: let it in.
                tab.wait_for_timeout(100)
                if not any(NETWORK_CHANGED in line for line in refused[seen:]):
                    break
            return response

        setattr(tab, name, load)


@pytest.fixture
def page(browser, request):
    """A fresh browser context (its own cookies and storage) and page, 1366×900 by default."""
    context = browser.new_context(viewport={"width": 1366, "height": 900})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    console_errors: list[str] = []
    tab.on("pageerror", lambda exc: console_errors.append(str(exc)))
    tab.js_errors = console_errors  # uncaught JavaScript errors so far: tests may assert it is empty
    # Requests that failed or were refused (a module script that never ran leaves no JS error).
    refused: list[str] = []
    tab.on("requestfailed", lambda req: refused.append(f"{req.method} {req.url}: {req.failure}"))
    tab.on("response", lambda res: refused.append(f"{res.request.method} {res.url}: {res.status}") if res.status >= 400 else None)
    load_again_when_the_network_changed(tab, refused)
    failed_before = request.session.testsfailed
    try:
        yield tab
    finally:
        name = artifact_name(request.node.name)
        failed = request.session.testsfailed > failed_before
        with contextlib.suppress(Exception):
            save_screenshot(tab, f"FAILED-{name}" if failed else f"{name}-end")
        if failed:
            if console_errors:
                print("JavaScript errors:\n" + "\n".join(console_errors))
            if refused:
                print("Requests failed or refused:\n" + "\n".join(refused[-20:]))
            if "live_console" in request.fixturenames:
                print("--- console server log (tail)\n" + request.getfixturevalue("live_console").server_log())
        context.close()


def login(page, console: LiveConsole, username: str, password: str) -> None:
    """Sign in through the login form and wait until the job list shows."""
    page.goto(f"{console.base_url}/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("button[type=submit]")
    page.wait_for_url(lambda url: "/login/" not in url)


def pass_log_sockets_through(page) -> list:
    """Routes the page's log WebSockets through to the server and returns the list each new one
    is appended to, so that a test can close one ("the connection is lost") and read its URL."""
    sockets: list = []

    def through_to_the_server(ws) -> None:
        ws.connect_to_server()
        sockets.append(ws)

    page.route_web_socket(re.compile(r"/ws/training-jobs/[0-9]+/logs/"), through_to_the_server)
    return sockets
