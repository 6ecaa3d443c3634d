"""The agent waits instead of polling: idle, it touches the database only for its heartbeat (and,
with Redis, not even that); a launch message starts a run and a stop reaches the run at once,
long before the agent's periodic reconcile would have found either."""

from __future__ import annotations

import os
import time

import pytest
from django.db import connection

from agent.node_agent import NodeAgent
from failover.models import NodeHealth
from jobs.models import JobAttempt, TrainingJob
from jobs.services.actions import request_stop
from jobs.services.placement import place_waiting_jobs
from jobs.statuses import JobStatus

SLOW = "python -c \"import time; print('up', flush=True); time.sleep(120)\""


def serve_idle(agent: NodeAgent, seconds: float) -> list[str]:
    """Run the agent as its loop does for ``seconds``; returns the SQL it issued meanwhile."""
    issued: list[str] = []

    def record(execute, sql, params, many, context):
        issued.append(sql)
        return execute(sql, params, many, context)

    end = time.monotonic() + seconds
    with connection.execute_wrapper(record):
        while time.monotonic() < end:
            agent.wakeup.wait(min(agent.delay(), max(0.0, end - time.monotonic())))
            agent.step()
    return issued


def wait_for(condition, what: str, seconds: float = 60.0) -> None:
    """Until ``condition()`` (read while the loop's thread writes: WAL readers never wait)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


@pytest.mark.django_db
@pytest.mark.slow  # the agent served for seconds of wall clock
def test_an_idle_agent_without_redis_only_writes_its_heartbeat(nodes, settings):
    settings.NODE_HEARTBEAT_TIMEOUT = 3.0  # a beat every second
    agent = NodeAgent(["node-a"])
    agent.step()  # its start: a beat and the reconcile

    issued = serve_idle(agent, 3.5)

    statements = [sql for sql in issued if not sql.startswith(("SAVEPOINT", "RELEASE SAVEPOINT"))]  # (PostgreSQL: the beat's transaction)
    assert statements, "it beat"
    assert all(sql.startswith('UPDATE "jobs_node"') for sql in statements), statements


@pytest.mark.django_db
@pytest.mark.slow  # the agent served for seconds of wall clock
def test_an_idle_agent_with_redis_queries_the_database_not_at_all_between_reconciles(nodes, settings, monkeypatch):
    from harness.scaleout import services_or_skip
    from jobs import heartbeats
    from jobs.services import messages

    _, redis_url = services_or_skip()
    settings.REDIS_URL = redis_url
    settings.SCALE_OUT = True
    settings.NODE_HEARTBEAT_TIMEOUT = 9.0  # Redis beats every 3 s, the database every 6 s
    settings.NODE_HEARTBEAT_DB_INTERVAL = 60.0
    settings.AGENT_RECONCILE_INTERVAL = 60.0
    monkeypatch.setattr(messages, "_redis", None)
    heartbeats.client().delete(heartbeats.BEATS)
    agent = NodeAgent(["node-a"])
    agent.step()  # its start: a beat (Redis and the database) and the reconcile
    first = heartbeats.scores(["node-a"])["node-a"]

    issued = serve_idle(agent, 4.0)

    assert issued == []
    assert heartbeats.scores(["node-a"])["node-a"] > first  # it beat into Redis meanwhile


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_launch_message_starts_the_run_and_a_stop_reaches_it_without_a_reconcile(nodes, make_job, settings):
    from agent.loop import EmbeddedControlLoop
    from agent.tasks import launch_attempt

    settings.AGENT_RECONCILE_INTERVAL = 3600.0  # only messages can do it here
    settings.STOP_GRACE_PERIOD = 30.0
    agent = NodeAgent([n.name for n in nodes], name="nodeagent-test")
    loop = EmbeddedControlLoop(agent, control=False)
    loop.start()
    try:
        wait_for(lambda: agent.next_reconcile > 0 and NodeHealth.objects.count() == len(nodes), "the agent's first round")
        job = make_job(command=SLOW)
        [attempt] = place_waiting_jobs()
        time.sleep(0.5)
        assert JobAttempt.objects.get(pk=attempt.pk).state == JobAttempt.State.PLACED  # nobody polls for it

        launch_attempt(attempt.pk)  # what the node's queue delivers
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.RUNNING, "the launch message started the run")
        [part] = attempt.placements.all()
        assert part.runner_pid and os.path.exists(f"/proc/{part.runner_pid}")

        request_stop(TrainingJob.objects.get(pk=job.pk), actor="owner")  # wakes the agent after commit
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.STOPPED, "the stop reached the run")
    finally:
        loop.stop()
        loop.join(15)
    job = TrainingJob.objects.get(pk=job.pk)
    assert "stopped by" in job.status_reason or job.status == JobStatus.STOPPED


@pytest.mark.django_db(transaction=True)
def test_an_exit_whose_report_the_database_refused_is_reported_again(nodes, make_job, agent, drive, monkeypatch):
    """The attempt's close committed, then the job's move was refused: the agent had already
    forgotten the rank, whose row said it had ended, so nothing reported it again and the job stayed
    Running for good. Now the control round's sweep makes the decision again and the job completes."""
    from harness.database import refuse_once
    from jobs.services import runs

    monkeypatch.setattr(runs, "CLOSE_GRACE", runs.CLOSE_GRACE * 0)
    refused = refuse_once(monkeypatch, runs, "transition", lambda job_id, to, **_: to == JobStatus.COMPLETED)
    job = drive(make_job(), JobStatus.COMPLETED, timeout=30)
    assert refused == [job.pk]
    assert job.attempts.get().state == JobAttempt.State.EXITED
    assert job.events.filter(to_status=JobStatus.COMPLETED).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow  # the embedded loop's thread and a real run
def test_a_control_round_the_database_refused_is_tried_again_without_waiting_an_interval(nodes, make_job, monkeypatch):
    """Rounds are 60 s apart here: the first one is refused (as when another writer holds SQLite
    past the busy timeout) and the job must still start within seconds, not a whole interval
    later."""
    from agent import loop as loop_module
    from harness.database import refuse_once

    refused = refuse_once(monkeypatch, loop_module, "control_round")
    job = make_job(command=SLOW)
    loop = loop_module.EmbeddedControlLoop(NodeAgent([n.name for n in nodes]), interval=60)
    loop.start()
    try:
        wait_for(lambda: TrainingJob.objects.get(pk=job.pk).status == JobStatus.RUNNING, "the refused round was tried again", 15)
    finally:
        loop.stop()
        loop.join(15)
    assert refused == [None] and not loop.is_alive()
