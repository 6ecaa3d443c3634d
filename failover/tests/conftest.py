"""Fixtures of the failover tests.

* ``no_run_outlives_its_test``: nothing a test that starts real runs starts outlives it (a module
  asks for it with ``pytestmark = pytest.mark.usefixtures("no_run_outlives_its_test")``);
* ``no_local_agent``: no node agent of an earlier test lives on in this process;
* ``gpus``: node-a has GPUs behind the fake pynvml, and a kernel log the test writes.
"""

from __future__ import annotations

import sys
import time

import pytest

from agent import runfiles
from failover.tests import fake_pynvml
from jobs.models import AttemptNode, Node


@pytest.fixture
def no_run_outlives_its_test(nodes):
    """Whatever a test leaves running (a failed assertion mid-run) is killed before its database goes."""
    yield
    import signal as _signal

    from agent.processes import is_runner, run_dir
    from agent.processes import signal_run as _signal_run

    for part in AttemptNode.objects.filter(runner_pid__gt=0).select_related("attempt"):
        deadline = time.monotonic() + 5  # a runner just started writes its pid record within moments
        while not runfiles.pid_written(run_dir(part)) and is_runner(part.runner_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_run(part, _signal.SIGKILL)


@pytest.fixture
def no_local_agent():
    """No node agent of an earlier test lives on in this process, so the policy judges by stored
    readings and sweeps every node, as a scale-out control plane does (a module asks for it with
    ``pytestmark = pytest.mark.usefixtures("no_local_agent")``): each test's agents leave the
    registry when it ends (``harness.isolation``)."""
    from agent import local_agents

    assert not local_agents.local_agents(), local_agents.local_agents()


@pytest.fixture
def gpus(monkeypatch, nodes, settings, tmp_path):
    """node-a has real GPUs behind the fake pynvml (four, installed as ``pynvml``), and a kernel
    log the test writes; the agents and health checkers of earlier tests are gone
    (``harness.isolation``)."""
    driver = fake_pynvml.reset(gpus=4)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    settings.KERNEL_LOG_PATH = str(tmp_path / "kmsg")
    (tmp_path / "kmsg").write_text("")
    Node.objects.filter(name="node-a").update(simulated=False)
    yield driver
    driver.release()
