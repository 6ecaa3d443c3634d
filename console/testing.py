"""Test fixtures shared by every app (loaded by the root conftest as a pytest plugin).

The three users of every access test (owner, teammate, outsider), staff, a job factory, and a
node agent on simulated GPUs that runs real processes. pytest-django has set Django up before
the root conftest loads this plugin, so models import at the top.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.cache import cache
from django.db import OperationalError

from agent import engine, local_agents
from agent.default_image import ensure as ensure_default_image
from agent.inventory import register_nodes, simulated_nodes
from agent.loop import embedded_round
from agent.node_agent import NodeAgent
from jobs.models import Image
from jobs.services.creation import create_job, personal_project_for
from jobs.services.images import qualify
from logs.models import LogLine

REPO = Path(__file__).resolve().parent.parent
# The suite shares the checkout's container storage and local registry: the default image is
# built once (on the first run) and pulled from there by every test's runs.
ENGINE_ROOT = Path(os.environ.get("CONTAINER_ENGINE_ROOT", str(REPO / "var" / "podman")))
os.environ["CONTAINER_ENGINE_ROOT"] = str(ENGINE_ROOT)
if os.environ.get("JOB_SANDBOX") == "off":
    SANDBOX_READY, SANDBOX_WHY = False, "JOB_SANDBOX=off"
else:
    SANDBOX_READY, SANDBOX_WHY = engine.availability(ENGINE_ROOT)
if not SANDBOX_READY and os.environ.get("JOB_SANDBOX") != "off":
    if os.environ.get("REQUIRE_SANDBOX") == "1":
        raise pytest.UsageError(f"REQUIRE_SANDBOX=1 but jobs cannot run in containers here: {SANDBOX_WHY}")
    # Jobs run on the host in this test run (the console processes the tests start included);
    # the container tests are skipped. pytest's header says so.
    os.environ["JOB_SANDBOX"] = "off"


def pytest_report_header(config) -> str:
    if SANDBOX_READY:
        return f"jobs run in containers: {SANDBOX_WHY}"
    return f"job containers: OFF for this run ({SANDBOX_WHY}); their tests are skipped. Install podman and runc to run them."


needs_sandbox = pytest.mark.skipif(not SANDBOX_READY, reason=f"jobs cannot run in containers here: {SANDBOX_WHY}")
DEFAULT_IMAGE_FIGURES: dict = {}


def default_image_ready() -> dict:
    """The local registry and the default image in it (built on the suite's first use)."""
    if not DEFAULT_IMAGE_FIGURES and SANDBOX_READY:
        name = qualify(settings.DEFAULT_IMAGE).split("/", 1)[1]
        DEFAULT_IMAGE_FIGURES.update(ensure_default_image(ENGINE_ROOT, settings.LOCAL_REGISTRY_PORT, name, log=lambda line: None))
    return DEFAULT_IMAGE_FIGURES


@pytest.fixture(autouse=True)
def job_work_root(request, tmp_path):
    """Every test's runs get their own working directories (where Django is in play), and users
    a fast password hash: users are made for nearly every test."""
    if not request.config.pluginmanager.hasplugin("django"):
        yield None
        return
    settings = request.getfixturevalue("settings")

    cache.clear()  # sign-in failure counts and request throttles start afresh in every test
    settings.JOB_WORK_ROOT = tmp_path / "jobs"
    settings.PROJECT_DATA_ROOT = tmp_path / "projects"
    settings.SIMULATED_DEVICE_DIR = tmp_path / "sim-devices"
    settings.JOB_UID_REGISTRY = tmp_path / "uids.json"
    settings.JOB_SANDBOX = os.environ.get("JOB_SANDBOX", "on")
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    yield settings.JOB_WORK_ROOT
    # Runs live in their own sessions (and containers) and outlive the test that started them.
    from agent.runner import kill_unfinished_runs

    kill_unfinished_runs(tmp_path / "jobs")


# A test that asks for one of these starts real processes (a live console server, Chromium, a
# node agent whose runs are real processes): it is slow, whether or not its module says so.
REAL_PROCESS_FIXTURES = frozenset({"live_console", "browser", "page", "agent", "drive"})


def pytest_collection_modifyitems(config, items) -> None:
    """Mark ``slow`` what ``make test-fast`` (``-m "not slow"``) leaves out: tests that start real
    processes (``REAL_PROCESS_FIXTURES``) and the scale-out cluster's (``scaleout``)."""
    for item in items:
        if "slow" in item.keywords:
            continue
        if REAL_PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("scaleout"):
            item.add_marker(pytest.mark.slow)


AGENTS_BEFORE = pytest.StashKey[set]()  # the agents of this process before a test


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[AGENTS_BEFORE] = set(map(id, local_agents.local_agents()))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Before a test's fixtures are torn down (a transactional test's database flush among them):

    * a node agent the test made is shut down: its health monitor's thread stopped, and it leaves
      this process's registry. A left-over agent "serves" its nodes, so the next tests' lost-node
      sweep would skip them; its monitor thread would go on writing while the next test's
      database is flushed;
    * then the embedded notification worker finishes what the test's status changes queued, and
      forgets what it would have retried later: a delivery made during the flush, or a retry due
      after the test, would write the last test's rows into the next test's database.

    One hook for both: a second definition of the same hook in this module would replace the
    first (``test_architecture`` refuses that)."""
    before = item.stash.get(AGENTS_BEFORE, set())
    for agent in local_agents.local_agents():
        if id(agent) not in before:
            shutdown = getattr(agent, "shutdown", None)
            if shutdown is not None:
                shutdown()
            local_agents.discard(agent)
    module = sys.modules.get("notify.worker")
    if module is not None and module.worker.thread is not None:
        module.worker.settle(timeout=10.0)
    yield


PLATFORM_LINE_PREFIXES = (
    "[console] pull: ",
    "[console] image ",
    "[console] this node has no CDI spec",
    "[INFO] Concurrent Checkpoint library is installed",
    "[console] environment ready",
)


def job_output(job, **filters) -> list[str]:
    """What the job's command printed, in order: its log without the lines the platform writes
    while preparing the run's container."""

    lines = LogLine.objects.filter(job=job, **filters).order_by("seq").values_list("text", flat=True)
    return [line for line in lines if not line.startswith(PLATFORM_LINE_PREFIXES)]


def refuse_once(monkeypatch, owner, name: str, when: Callable[..., bool] = lambda *args, **kwargs: True) -> list:
    """Make ``owner.name`` fail once, where ``when(*args)`` says, as the database does when it
    cannot serve a write (SQLite held by another writer past the busy timeout, PostgreSQL gone);
    returns the refused calls' first arguments."""

    real = getattr(owner, name)
    refused: list = []

    def refusing(*args, **kwargs):
        if not refused and when(*args, **kwargs):
            refused.append(args[0] if args else None)
            raise OperationalError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, refusing)
    return refused


@pytest.fixture
def owner(db):

    return User.objects.create_user("owner", password="owner-pass-1")


@pytest.fixture
def teammate(db, owner):

    user = User.objects.create_user("teammate", password="teammate-pass-1")
    personal_project_for(owner).members.add(user)
    return user


@pytest.fixture
def outsider(db):

    return User.objects.create_user("outsider", password="outsider-pass-1")


@pytest.fixture
def staff(db):

    return User.objects.create_user("operator", password="operator-pass-1", is_staff=True, is_superuser=True)


@pytest.fixture
def data_volume(settings):
    """/data is a writable volume of every project: output directories may lie in it."""
    settings.JOB_VOLUMES = "/data:rw"


@pytest.fixture
def project(owner):

    return personal_project_for(owner)


@pytest.fixture
def default_image(request, db, settings):
    """The default image's row; built in the local registry for a test that runs jobs (one marked
    ``slow``: a test of the fast lane starts no process, so it never pulls an image)."""
    if request.node.get_closest_marker("slow"):
        default_image_ready()
    image, _ = Image.objects.get_or_create(reference=settings.DEFAULT_IMAGE, defaults={"is_default": True})
    return image


@pytest.fixture
def make_job(owner, default_image) -> Callable:

    counter = {"n": 0}

    def make(**fields):
        counter["n"] += 1
        fields.setdefault("name", f"job-{counter['n']}")
        fields.setdefault("image", default_image.reference)
        fields.setdefault("command", "python -c 'print(1)'")
        fields.setdefault("gpus_per_node", 1)
        return create_job(owner=fields.pop("owner", owner), **fields)

    return make


@pytest.fixture
def nodes(db, settings):
    """Three simulated nodes with four GPUs each, registered as the embedded agent does."""

    settings.SIMULATED_NODES = 3
    settings.SIMULATED_GPUS_PER_NODE = 4
    return register_nodes(simulated_nodes(), agent="embedded")


@pytest.fixture
def agent(nodes, settings):

    settings.STOP_GRACE_PERIOD = 5.0
    return NodeAgent([n.name for n in nodes])


@pytest.fixture
def drive(agent) -> Callable:
    """Run placement and the agent until the job reaches one of ``statuses`` (or time runs out)."""

    def run(job, statuses: set[str] | str, *, timeout: float = 60.0):
        wanted = {statuses} if isinstance(statuses, str) else set(statuses)
        deadline = time.monotonic() + timeout
        while True:
            embedded_round(agent)
            job.refresh_from_db()
            if job.status in wanted:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job.name} is {job.status} ({job.status_reason}), wanted {wanted}")
            time.sleep(0.1)

    return run
