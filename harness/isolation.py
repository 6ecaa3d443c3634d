"""What each test gets afresh and what it leaves behind.

Before: its own job work directories, project data and simulated devices, an empty cache (sign-in
failure counts and request throttles), a fast password hash; ``fresh_throttle`` for a module that
asks for it. After: the node agents it made are shut down and the embedded notification worker
has finished what its status changes queued. pytest-django has set Django up before the root
conftest loads this plugin, so models import at the top.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.cache import cache

from agent import local_agents
from logs import progress


@pytest.fixture(scope="session")
def console_var_dir(tmp_path_factory) -> Path:
    """This test process's own console state directory (``VAR_DIR``), so its own install id: the
    containers and job networks its agents start are named for it, and an agent's start-up sweep
    of "this console's" strays never touches those of another pytest process running beside it
    (``make test`` runs lanes side by side). As a console's, it holds the key the console signs
    with (0600): the sandbox tests check that no job reads it."""
    from django.conf import settings

    var = tmp_path_factory.mktemp("var")
    var.chmod(0o700)
    key = var / "secret_key"
    key.write_text(settings.SECRET_KEY)
    key.chmod(0o600)
    return var


@pytest.fixture(autouse=True)
def job_work_root(request, tmp_path):
    """Every test's runs get their own working directories (where Django is in play), and users
    a fast password hash: users are made for nearly every test."""
    if not request.config.pluginmanager.hasplugin("django"):
        yield None
        return
    settings = request.getfixturevalue("settings")

    cache.clear()  # sign-in failure counts and request throttles start afresh in every test
    settings.VAR_DIR = request.getfixturevalue("console_var_dir")
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


@pytest.fixture
def fresh_throttle(monkeypatch):
    """The live progress throttle forgets when it last published each job's progress, so a test's
    first progress line is published at once (a module asks for it with
    ``pytest.mark.usefixtures("fresh_throttle")``)."""
    monkeypatch.setattr(progress, "_last_published", {})


AGENTS_BEFORE = pytest.StashKey[set]()  # the agents and health checkers of this process before a test


def live_checkers() -> list:
    health = sys.modules.get("failover.services.health")
    return health.live_checkers() if health is not None else []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    item.stash[AGENTS_BEFORE] = set(map(id, [*local_agents.local_agents(), *live_checkers()]))
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Before a test's fixtures are torn down (a transactional test's database flush among them):

    * a node agent the test made is shut down: its health monitor's thread stopped, and it leaves
      this process's registry. A left-over agent "serves" its nodes, so the next tests' lost-node
      sweep would skip them; its monitor thread would go on writing while the next test's
      database is flushed. A health checker the test made without an agent is closed too (a
      left-over one would answer the next test's usage readings for its nodes). Both were
      once left for a ``gc.collect()`` to forget (0.3 s each, 50 times a fast lane);
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
                shutdown()  # closes its health checker
            local_agents.discard(agent)
    for checker in live_checkers():
        if id(checker) not in before:
            checker.close()
    module = sys.modules.get("notify.worker")
    if module is not None and module.worker.thread is not None:
        module.worker.settle(timeout=10.0)
    yield


@pytest.fixture(autouse=True)
def no_process_in_the_fast_lane(request, monkeypatch):
    """A test not marked ``slow`` starts no process, whatever code it calls: the fast lane's rule
    (``test_fast_lane_is_hermetic`` reads the tests; this catches product code they call that
    starts one, e.g. an agent's heartbeat that sweeps containers with Podman)."""
    if request.node.get_closest_marker("slow"):
        return

    def refused(*args, **kwargs):
        raise AssertionError(f"a test not marked slow started a process ({args[1] if len(args) > 1 else args}): mark it slow or keep it from starting one")

    monkeypatch.setattr(subprocess.Popen, "_execute_child", refused)
    monkeypatch.setattr(os, "fork", refused)
    monkeypatch.setattr(os, "posix_spawn", refused)
