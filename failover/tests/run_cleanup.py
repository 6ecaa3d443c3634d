"""A fixture the tests that start real runs share: nothing they start outlives them (a module
asks for it with ``pytestmark = pytest.mark.usefixtures("no_run_outlives_its_test")``)."""

import time

import pytest

from agent import runfiles
from jobs.models import AttemptNode


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
