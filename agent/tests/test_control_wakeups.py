"""The embedded loop runs a control round when something changed its answer, not on a clock: idle,
it runs none; a job created, a write to the wake file by another process, or the round's own
timed work each bring one. Rounds are counted, not timed (timing is ``bench.idle``'s)."""

from __future__ import annotations

import time

import pytest

from agent import loop as loop_module
from agent.node_agent import NodeAgent
from jobs.models import JobAttempt
from jobs.services.control import Round

# The embedded loop on its own thread, watched for seconds of wall clock: not the fast lane's.
pytestmark = pytest.mark.slow

IDLE = 2.0  # seconds an idle loop is watched: four rounds of the old 0.5 s schedule


class NoLaunch:
    """Places stay placed: these tests are about the control round, not about runs."""

    children: dict = {}

    def launch(self, attempt):
        return []

    def signal(self, part, sig) -> bool:
        return False

    def alive(self, pid) -> bool:
        return False

    def reap(self) -> None:
        pass


def wait_for(condition, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


@pytest.fixture
def quiet(settings, tmp_path):
    """No safety sweep within a test, and a wake file of the test's own."""
    settings.CONTROL_WAKEUPS = True
    settings.CONTROL_SWEEP_INTERVAL = 3600.0
    settings.CONTROL_WAKE_FILE = tmp_path / "control-wanted"
    settings.CONTROL_WAKE_FILE_CHECK = 0.1
    return settings.CONTROL_WAKE_FILE


@pytest.fixture
def rounds(monkeypatch) -> list[Round]:
    """Every control round the loop runs, as it returned."""
    real, seen = loop_module.control_round, []

    def counted():
        result = real()
        seen.append(result)
        return result

    monkeypatch.setattr(loop_module, "control_round", counted)
    return seen


@pytest.fixture
def serve(nodes, quiet):
    """Start the embedded loop on an agent that launches nothing; stopped after the test."""
    started = []

    def start() -> loop_module.EmbeddedControlLoop:
        loop = loop_module.EmbeddedControlLoop(NodeAgent([n.name for n in nodes], launcher=NoLaunch()))
        loop.start()
        started.append(loop)
        return loop

    yield start
    for loop in started:
        loop.stop()
        loop.join(15)
        assert not loop.is_alive()


@pytest.mark.django_db(transaction=True)
def test_an_idle_loop_runs_no_round_until_a_job_is_created(serve, rounds, make_job):
    serve()
    wait_for(lambda: len(rounds) == 1, "the first round at start")
    time.sleep(IDLE)
    assert len(rounds) == 1, "an idle loop ran control rounds with nothing to do"

    job = make_job()

    wait_for(lambda: len(rounds) >= 2, "the created job brought no round")
    assert JobAttempt.objects.filter(job=job).exists()
    assert [len(placed) for placed in rounds[:2]] == [0, 1]


@pytest.mark.django_db(transaction=True)
def test_a_write_to_the_wake_file_by_another_process_brings_a_round_and_a_reconcile(serve, rounds, quiet, monkeypatch):
    loop = serve()
    reconciles = []
    real_reconcile = loop.agent.reconcile
    monkeypatch.setattr(loop.agent, "reconcile", lambda: (reconciles.append(1), real_reconcile())[1])
    wait_for(lambda: len(rounds) == 1 and reconciles, "the first round and reconcile at start")
    before = len(reconciles)

    with open(quiet, "ab") as other_process:  # what manage.py inject_fault's process appends
        other_process.write(b".")

    wait_for(lambda: len(rounds) == 2, "the wake file brought no round")
    wait_for(lambda: len(reconciles) > before, "the wake file brought no reconcile")
    time.sleep(IDLE)
    assert len(rounds) == 2, "one write, one round"


@pytest.mark.django_db(transaction=True)
def test_a_round_with_timed_work_is_followed_by_one_at_that_moment(serve, monkeypatch):
    seen = []

    def round_with_work_soon():
        seen.append(time.time())
        return Round(next_due=time.time() + 0.3 if len(seen) == 1 else None)

    monkeypatch.setattr(loop_module, "control_round", round_with_work_soon)
    serve()

    wait_for(lambda: len(seen) >= 2, "the timed work's round never ran")
    time.sleep(IDLE)
    assert len(seen) == 2, "no timed work was left, and rounds went on"


@pytest.mark.django_db(transaction=True)
def test_the_old_fixed_schedule_is_still_there_for_comparison(serve, rounds, settings):
    settings.CONTROL_WAKEUPS = False
    settings.AGENT_POLL_INTERVAL = 0.2

    loop = serve()

    wait_for(lambda: len(rounds) >= 4, "the fixed schedule ran no rounds")
    assert loop.polling and loop.interval == 0.2
