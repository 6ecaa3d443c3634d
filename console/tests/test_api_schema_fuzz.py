"""Schemathesis fuzzes every operation of the published schema: no request, however odd, may
make the API fail (5xx) or answer with a body its own schema does not describe."""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterator
from datetime import timedelta

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.utils import timezone
from hypothesis import HealthCheck, settings
from knox.models import AuthToken
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from harness.api import move_to
from jobs.models import GPU, AttemptNode, JobAttempt, Node
from jobs.statuses import JobStatus
from logs.models import LogLine

# Loaded once at collection: schemathesis 4's lazy ``from_fixture`` does not run on pytest 9.
schema = schemathesis.openapi.from_wsgi("/api/schema/", WSGIHandler())


@pytest.fixture
def requests_on_the_test_connection() -> Iterator[None]:
    """Let the WSGI app answer inside the test's transaction, so it sees the test's rows.

    Django's own test client does the same: a request must not close the test's connection.
    """
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def world(db, requests_on_the_test_connection, owner, teammate, staff, project, make_job) -> dict:
    """Jobs in the owner's project (one with an attempt and a log), a node with GPUs, and tokens."""
    node = Node.objects.create(name="node-a", gpu_model="H100", simulated=True)
    for index in range(2):
        GPU.objects.create(node=node, index=index, model="H100", memory_mb=81559)
    running = move_to(make_job(name="running-job", env={"EPOCHS": "3"}), JobStatus.RUNNING)
    attempt = JobAttempt.objects.create(job=running, number=1, state=JobAttempt.State.RUNNING, started_at=timezone.now())
    AttemptNode.objects.create(attempt=attempt, node=node, gpu_indices=[0, 1])
    start = timezone.now()
    LogLine.objects.bulk_create(
        LogLine(job=running, stream="master", attempt=1, seq=seq, line_no=seq, ts=start + timedelta(seconds=seq), text=f"step {seq}") for seq in range(1, 31)
    )
    finished = move_to(make_job(name="finished-job"), JobStatus.COMPLETED)
    pending = make_job(name="pending-job", owner=teammate, project=project)
    return {
        "job_ids": [running.pk, finished.pk, pending.pk],
        "node_keys": ["node-a", str(node.pk)],
        "owner_token": AuthToken.objects.create(owner)[1],
        "staff_token": AuthToken.objects.create(staff)[1],
    }


FRESH_NAMES = itertools.count(1)


def aim_at_real_objects(case, world: dict) -> None:
    """Most cases address objects that exist, and some jobs get a valid command, so that the
    successful answers are checked too; the rest keep their fuzzed values (mostly 404s and 400s)."""
    for name, pool in (("id", world["job_ids"]), ("name", world["node_keys"])):
        if case.path_parameters and name in case.path_parameters:
            digest = zlib.crc32(repr(case.path_parameters[name]).encode())
            if digest % 4:
                case.path_parameters[name] = pool[digest % len(pool)]
    if case.path == "/api/v1/training-jobs/" and case.method == "POST" and isinstance(case.body, dict) and zlib.crc32(repr(case.body).encode()) % 2:
        case.body["command"] = "python train.py"
        case.body["name"] = f"fuzzed-{next(FRESH_NAMES)}"


@pytest.mark.slow  # hypothesis cases against every endpoint (minutes)
@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_makes_the_api_fail_or_break_its_schema(case, world):
    aim_at_real_objects(case, world)
    token = world["staff_token"] if case.path.startswith("/api/v1/nodes") else world["owner_token"]

    case.call_and_validate(
        headers={"Authorization": f"Token {token}"},
        checks=[not_a_server_error, response_schema_conformance],
    )
