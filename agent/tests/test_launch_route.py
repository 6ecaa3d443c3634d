"""A launch arrives one way — an attempt id in the agent's inbox, launched by ``step`` — whoever
sends it (the control round, a message, the reconcile); the agent reports what it started
(``runs.part_started``: the runner's pid, the resume step) and re-reads the job once after a
launch instead of reconciling again. Only the run's OS process is simulated here."""

from __future__ import annotations

import ast
import itertools
import signal
import time
from pathlib import Path

import pytest

from agent import runfiles
from agent.engine import PullResult
from agent.launch import Launcher
from agent.node_agent import NodeAgent
from agent.processes import run_dir
from jobs.backends.facts import exited
from jobs.models import AttemptNode, JobAttempt, TrainingJob
from jobs.services import runs
from jobs.services.actions import request_stop
from jobs.services.placement import place_waiting_jobs
from jobs.statuses import JobStatus

pytestmark = pytest.mark.django_db

DIGEST = "sha256:" + "0" * 64
FAKE_PIDS = itertools.count(2**23)  # above Linux's pid_max: never a real process


class FakeLauncher(Launcher):
    """The real launch (claims, directories, reports) with the runner's process simulated."""

    def __init__(self, node_names) -> None:
        super().__init__(node_names)
        self.started: list[tuple[int, int | None]] = []  # (part id, resume step)
        self.signals: list[tuple[int, int]] = []

    def containers_ready(self):
        return True, "simulated"

    def pull(self, job, attempt):
        return PullResult(True, DIGEST, "simulated pull"), f"{job.image}@{DIGEST}"

    def start_runner(self, job, attempt, part, dirs, *, image_ref, uid, resume_step=None) -> int:
        directory = run_dir(part)
        directory.mkdir(parents=True, exist_ok=True)
        pid = next(FAKE_PIDS)
        runfiles.write_pid(directory, runfiles.PidRecord(runner_pid=pid, pgid=None, started_at=time.time()))
        self.started.append((part.pk, resume_step))
        return pid

    def alive(self, pid: int) -> bool:
        return True

    def signal(self, part, sig: int) -> bool:
        self.signals.append((part.pk, sig))
        return True


def fake_agent(nodes) -> NodeAgent:
    names = [n.name for n in nodes]
    return NodeAgent(names, launcher=FakeLauncher(names))


def test_the_control_rounds_placements_are_only_queued_and_the_step_launches_each_once(nodes, make_job):
    job = make_job()
    [attempt] = place_waiting_jobs()
    agent = fake_agent(nodes)
    agent.step()  # its start: a beat and the reconcile (which queues the placed attempt too)
    agent.launch_attempts([attempt])
    agent.launch_attempts([attempt])
    agent.request_launch(attempt.pk)  # a launch message for the same attempt
    assert len(agent.launcher.started) == 1
    part = AttemptNode.objects.get(attempt=attempt)
    assert part.runner_pid and part.runner_pid > 2**22
    assert TrainingJob.objects.get(pk=job.pk).status == JobStatus.RUNNING
    assert list(agent.inbox) == [attempt.pk]
    agent.step()
    assert len(agent.launcher.started) == 1 and not agent.inbox  # claimed already: nothing started twice


def test_queued_ids_wait_for_the_step(nodes, make_job):
    make_job()
    agent = fake_agent(nodes)
    agent.reconcile_due = False
    agent.next_reconcile = time.monotonic() + 3600
    [attempt] = place_waiting_jobs()
    agent.launch_attempts([attempt])
    assert AttemptNode.objects.get(attempt=attempt).runner_pid is None and agent.delay() == 0.0
    agent.step()
    assert AttemptNode.objects.get(attempt=attempt).runner_pid


def test_the_reconcile_puts_placed_ranks_not_started_into_the_inbox(nodes, make_job):
    """The recovery after a restart or a lost message: no message, and one step starts it."""
    make_job(node_count=2)
    [attempt] = place_waiting_jobs()
    agent = fake_agent(nodes)
    agent.reconcile()
    assert list(agent.inbox) == [attempt.pk] and agent.launcher.started == []
    agent.tick()
    assert len(agent.launcher.started) == 2
    attempt.refresh_from_db()
    assert attempt.state == JobAttempt.State.RUNNING


def test_the_runner_pid_and_resume_step_are_reported_and_the_control_plane_records_them(nodes, make_job, monkeypatch, settings):
    from agent import launch, resume

    settings.JOB_SANDBOX = "on"  # the (simulated) pull reports the image's digest
    monkeypatch.setattr(launch, "resume_point", lambda job, location, contained: resume.ResumePoint(42, "/job/work/results/concurrent_checkpoint"))
    reported: list[dict] = []
    real = runs.part_started
    monkeypatch.setattr(runs, "part_started", lambda part, **facts: reported.append(facts) or real(part, **facts))
    job = make_job()
    [attempt] = place_waiting_jobs()
    JobAttempt.objects.filter(pk=attempt.pk).update(number=2)  # a later attempt: it resumes
    agent = fake_agent(nodes)
    agent.tick()
    part = AttemptNode.objects.get(attempt=attempt)
    assert reported == [{"runner_pid": part.runner_pid, "workdir": part.workdir, "resume_step": 42}]
    assert agent.launcher.started == [(part.pk, 42)]
    attempt.refresh_from_db()
    assert (attempt.resume_step, attempt.image_digest) == (42, f"{job.image}@{DIGEST}")
    assert "resuming from checkpoint step 42" in TrainingJob.objects.get(pk=job.pk).status_reason


def test_a_stop_that_raced_the_launch_is_delivered_in_the_same_step_without_another_reconcile(nodes, make_job, monkeypatch, settings):
    settings.STOP_GRACE_PERIOD = 60.0
    real = runs.part_started

    def started_then_stopped(part, **facts):
        moved = real(part, **facts)
        # The owner stops the job between the run's start and the agent's next read of it (its
        # wake-up is sent after commit: never, in this test's transaction).
        request_stop(TrainingJob.objects.get(pk=part.attempt.job_id), actor="owner")
        return moved

    monkeypatch.setattr(runs, "part_started", started_then_stopped)
    job = make_job()
    [attempt] = place_waiting_jobs()
    agent = fake_agent(nodes)
    agent.tick()
    assert TrainingJob.objects.get(pk=job.pk).status == JobStatus.STOPPING
    part = AttemptNode.objects.get(attempt=attempt)
    assert agent.launcher.signals == [(part.pk, signal.SIGTERM)]
    assert agent.reconcile_due is False


def test_a_failed_rank_signals_only_its_own_agents_ranks_the_others_end_through_the_stop_request(nodes, make_job):
    """Two agents, one rank each: rank 0's agent never signals rank 1 (on a shared JOB_WORK_ROOT
    its pid names another machine's process); rank 1's agent ends it, told by the stop request."""
    make_job(node_count=2)
    [attempt] = place_waiting_jobs()
    first, second = (fake_agent([node]) for node in nodes[:2])
    for agent in (first, second):
        agent.request_launch(attempt.pk)
        agent.tick()
    parts = {p.node.name: p for p in AttemptNode.objects.filter(attempt=attempt).select_related("attempt", "node")}
    mine, theirs = parts[nodes[0].name], parts[nodes[1].name]
    first.part_ended(mine, exited(1, None))
    assert all(part_id != theirs.pk for part_id, _ in first.launcher.signals)
    assert JobAttempt.objects.get(pk=attempt.pk).stop_requested_at is not None
    second.reconcile()
    second.enforce_stops()
    assert (theirs.pk, signal.SIGTERM) in second.launcher.signals


AGENT = Path(__file__).resolve().parents[1]
WRITES = {"update", "save", "create", "delete", "bulk_create", "bulk_update", "update_or_create", "get_or_create"}


def test_the_agent_writes_no_job_attempt_or_rank_itself():
    """Facts go to ``jobs.services.runs``, which decides; the agent's own queries only read."""
    found = []
    for path in sorted(AGENT.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in WRITES:
                receiver = ast.unparse(node.func.value)
                if receiver.startswith(("JobAttempt.objects", "AttemptNode.objects", "TrainingJob.objects")):
                    found.append(f"{path.name}:{node.lineno}: {receiver}.{node.func.attr}")
    assert found == []
