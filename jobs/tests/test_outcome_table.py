"""The one table from how a run ended to where its job goes (``jobs.backends.outcomes``): one case
per end kind and situation, every kind has its row, and the words (``facts.describe``) are the
ones the console has always shown."""

from __future__ import annotations

import signal

import pytest

from jobs.backends.facts import PLAIN, Ended, EndKind, describe, exited
from jobs.backends.outcomes import WHILE_RUNNING, Outcome, outcome
from jobs.statuses import JobStatus

S = JobStatus
JUDGED = "judged"

# kind → where a Running job goes (Job Failover on), not reclaimed, not being stopped.
RUNNING = {
    EndKind.EXITED: JUDGED,  # a non-zero exit (0 is Completed, below)
    EndKind.SIGNALED: JUDGED,
    EndKind.OUT_OF_MEMORY: (S.FAILED, "{cause}; raise the job's memory limit"),
    EndKind.PID_LIMIT: (S.FAILED, "{cause}"),
    EndKind.STORAGE_LIMIT: (S.FAILED, "{cause}"),
    EndKind.TIME_LIMIT: (S.FAILED, "max run time exceeded: {cause}"),
    EndKind.PREEMPTED: (S.PENDING, "{yielded}; {cause}"),
    EndKind.NODE_LOST: JUDGED,
    EndKind.SUPERVISOR_LOST: JUDGED,
    EndKind.EXIT_UNREADABLE: JUDGED,
    EndKind.HUNG_AFTER_KILL: JUDGED,
    EndKind.CANCELLED: JUDGED,
    EndKind.LAUNCH_FAILED: (S.FAILED, "could not start the run: {detail}"),
    EndKind.ABANDONED: JUDGED,
}


def decide(kind: EndKind, *, stopping: bool = False, reclaimed: bool = False, exit_code: int | None = 1, failover_on: bool = True) -> Outcome:
    return outcome(kind, stopping=stopping, reclaimed=reclaimed, exit_code=exit_code, failover_on=failover_on)


def test_every_kind_has_its_row():
    assert set(WHILE_RUNNING) == set(EndKind)
    assert set(RUNNING) == set(EndKind)


@pytest.mark.parametrize("kind", list(EndKind))
def test_a_running_jobs_end(kind):
    got = decide(kind)
    if RUNNING[kind] == JUDGED:
        assert got.judge and got.status == S.FAILOVER_IN_PROGRESS
        assert got.lost == (kind is EndKind.NODE_LOST)
    else:
        assert (got.status, got.reason, got.judge) == (*RUNNING[kind], False)


@pytest.mark.parametrize("kind", list(EndKind))
def test_with_failover_off_what_would_be_judged_fails(kind):
    got = decide(kind, failover_on=False)
    if RUNNING[kind] == JUDGED:
        assert (got.status, got.reason, got.judge) == (S.FAILED, "{cause}; Job Failover is off", False)
    else:
        assert got == decide(kind)


@pytest.mark.parametrize("kind", list(EndKind))
def test_a_job_being_stopped_is_stopped_however_its_run_ended(kind):
    for exit_code in (0, 1, None):
        assert decide(kind, stopping=True, reclaimed=True, exit_code=exit_code) == Outcome(S.STOPPED, "{stopped}; {cause}")


@pytest.mark.parametrize("kind", list(EndKind))
def test_a_reclaimed_run_goes_back_to_the_queue_unless_it_never_launched(kind):
    got = decide(kind, reclaimed=True, exit_code=0)
    if kind is EndKind.LAUNCH_FAILED:
        assert got.status == S.FAILED
    else:
        assert got == Outcome(S.PENDING, "{yielded}; {cause}")


def test_exit_code_0_completes_and_only_a_plain_exit():
    assert decide(EndKind.EXITED, exit_code=0) == Outcome(S.COMPLETED, "exit code 0")
    assert decide(EndKind.EXITED, exit_code=0, failover_on=False).status == S.COMPLETED
    for kind in set(EndKind) - {EndKind.EXITED}:
        assert decide(kind, exit_code=0).status != S.COMPLETED, kind


# --- the words --------------------------------------------------------------------------------
WORDS = [
    (exited(0, None), "exit code 0"),
    (exited(3, None), "exit code 3"),
    (exited(None, signal.SIGKILL), "killed by SIGKILL"),
    (exited(None, 77), "killed by signal 77"),
    (Ended(EndKind.OUT_OF_MEMORY, exit_signal=9, limit=2048), "out of memory: the run needed more than its memory limit of 2 GiB and the kernel killed it"),
    (Ended(EndKind.OUT_OF_MEMORY, exit_code=137), "out of memory: the run needed more than its memory limit and the kernel killed it"),
    (Ended(EndKind.PID_LIMIT, exit_code=1, limit=64), "PID limit reached: the run kept its limit of 64 processes (a fork loop?) and the platform ended it"),
    (Ended(EndKind.PID_LIMIT, exit_code=1), "PID limit reached: the run kept its process limit (a fork loop?) and the platform ended it"),
    (Ended(EndKind.STORAGE_LIMIT, detail="storage limit reached: used 2 GiB"), "storage limit reached: used 2 GiB"),
    (Ended(EndKind.SUPERVISOR_LOST), "the run's supervisor process was lost"),
    (
        Ended(EndKind.SUPERVISOR_LOST, exit_signal=9, handle="41", state="CANCELLED"),
        "killed by SIGKILL: Slurm job 41 CANCELLED, its runner left no exit record",
    ),
    (Ended(EndKind.EXIT_UNREADABLE), "the run's exit record was unreadable"),
    (Ended(EndKind.HUNG_AFTER_KILL, exit_signal=9, detail="Xid 79 on GPU 0"), "fatal GPU event (Xid 79 on GPU 0); the run did not exit after SIGKILL"),
    (Ended(EndKind.NODE_LOST, node="node-a", detail="no heartbeat for 12s"), "node node-a lost (no heartbeat for 12s)"),
    (Ended(EndKind.NODE_LOST, handle="7", state="NODE_FAIL"), "Slurm ended job 7: NODE_FAIL"),
    (Ended(EndKind.CANCELLED, handle="7", state="CANCELLED", detail="by 0"), "Slurm ended job 7: CANCELLED (by 0)"),
    (Ended(EndKind.TIME_LIMIT, handle="7", state="TIMEOUT"), "Slurm ended job 7: TIMEOUT"),
    (Ended(EndKind.PREEMPTED, handle="7"), "preempted by Slurm (job 7) for higher-priority work"),
    (
        Ended(EndKind.PREEMPTED, handle="7", detail="the run's supervisor process was lost"),
        "preempted by Slurm (job 7) for higher-priority work; the run's supervisor process was lost",
    ),
    (Ended(EndKind.LAUNCH_FAILED, detail="no such directory"), "launch failed: no such directory"),
    (Ended(EndKind.ABANDONED, detail="job is Stopped"), "job is Stopped"),
]


@pytest.mark.parametrize(("fact", "words"), WORDS, ids=[w[:40] for _, w in WORDS])
def test_the_words_of_each_end(fact, words):
    assert describe(fact) == words


def test_every_kind_has_its_words_and_only_the_plain_ones_say_no_more_than_the_exit():
    assert {fact.kind for fact, _ in WORDS} == set(EndKind)
    assert {EndKind.EXITED, EndKind.SIGNALED} == PLAIN
    assert [fact.plain for fact in (exited(0, None), exited(None, 9), Ended(EndKind.SUPERVISOR_LOST))] == [True, True, False]
