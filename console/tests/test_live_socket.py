"""The live pages' WebSocket: status changes and progress of the jobs a user may see."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from channels.db import database_sync_to_async
from knox.models import AuthToken

from console.asgi import application
from harness.sockets import Communicator
from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus
from logs.services import RawLine, ingest_lines

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.usefixtures("fresh_throttle")]

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def token_for(user) -> bytes:
    return f"Token {AuthToken.objects.create(user)[1]}".encode()


async def connect(user=None, query: str = "", *, expect_ready: bool = True) -> Communicator:
    headers = []
    if user is not None:
        headers.append((b"authorization", await database_sync_to_async(token_for)(user)))
    communicator = Communicator(application, "/ws/training-jobs/" + ("?" + query if query else ""), headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    if expect_ready:
        ready = await communicator.receive_json_from()
        assert ready["type"] == "ready" and ready["now"]
    return communicator


async def move(job_id: int, status: str, **fields) -> None:
    assert await database_sync_to_async(transition)(job_id, status, reason=f"to {status}", **fields)


async def next_job_message(ws) -> dict:
    message = await ws.receive_json_from()
    assert message["type"] == "job", message
    return message


async def test_the_owner_sees_status_changes_with_what_the_row_needs(make_job, owner):
    job = await database_sync_to_async(make_job)()
    ws = await connect(owner)
    await move(job.pk, JobStatus.RUNNING, started_at=NOW)
    message = await next_job_message(ws)
    assert message["from"] == "Pending"
    snapshot = message["job"]
    assert {k: snapshot[k] for k in ("id", "status", "badge", "icon", "reason", "failover_count", "max_failovers", "started_at", "finished_at")} == {
        "id": job.pk,
        "status": "Running",
        "badge": "running",
        "icon": "play",
        "reason": "to Running",
        "failover_count": 0,
        "max_failovers": 3,
        "started_at": NOW.isoformat(),
        "finished_at": None,
    }
    assert snapshot["stoppable"] is True and snapshot["progress"] is None

    await move(job.pk, JobStatus.FAILOVER_IN_PROGRESS)
    message = await next_job_message(ws)
    assert (message["job"]["status"], message["job"]["badge"], message["job"]["icon"]) == ("Pending - failoverinprogress", "failover", "refresh")
    await ws.disconnect()


async def test_a_teammate_sees_the_shared_jobs_changes(make_job, teammate):
    job = await database_sync_to_async(make_job)()
    ws = await connect(teammate)
    await move(job.pk, JobStatus.RUNNING)
    assert (await next_job_message(ws))["job"]["id"] == job.pk
    await ws.disconnect()


async def test_an_outsider_sees_nothing_of_others_jobs_but_their_own(make_job, outsider):
    job = await database_sync_to_async(make_job)()
    theirs = await database_sync_to_async(make_job)(owner=outsider, name="theirs")
    ws = await connect(outsider)
    await move(job.pk, JobStatus.RUNNING)
    await move(theirs.pk, JobStatus.RUNNING)
    message = await next_job_message(ws)
    assert message["job"]["id"] == theirs.pk
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_staff_see_every_job(make_job, staff):
    job = await database_sync_to_async(make_job)()
    ws = await connect(staff)
    await move(job.pk, JobStatus.RUNNING)
    assert (await next_job_message(ws))["job"]["id"] == job.pk
    await ws.disconnect()


async def test_one_jobs_socket_gets_only_that_job(make_job, owner):
    job = await database_sync_to_async(make_job)()
    other = await database_sync_to_async(make_job)()
    ws = await connect(owner, f"job={job.pk}")
    await move(other.pk, JobStatus.RUNNING)
    await move(job.pk, JobStatus.RUNNING)
    assert (await next_job_message(ws))["job"]["id"] == job.pk
    assert await ws.receive_nothing(timeout=0.3)
    await ws.disconnect()


async def test_an_outsider_cannot_follow_one_job(make_job, outsider):
    job = await database_sync_to_async(make_job)()
    ws = await connect(outsider, f"job={job.pk}", expect_ready=False)
    assert (await ws.receive_output())["code"] == 4404
    missing = await connect(outsider, "job=999999", expect_ready=False)
    assert (await missing.receive_output())["code"] == 4404


async def test_without_credentials_the_socket_closes_with_4401():
    ws = await connect(None, expect_ready=False)
    assert (await ws.receive_output())["code"] == 4401


@pytest.mark.parametrize("query", ["job=abc", "job=0", "job=-1", "job=" + "9" * 30, "job=%FF"])
async def test_bad_parameters_close_with_4400(owner, query):
    ws = await connect(owner, query, expect_ready=False)
    assert (await ws.receive_output())["code"] == 4400


async def test_client_messages_get_an_error_not_a_crash(owner):
    ws = await connect(owner)
    await ws.send_to(text_data="not json")
    assert (await ws.receive_json_from())["type"] == "error"
    await ws.send_json_to({"type": "subscribe", "job": 1})
    assert (await ws.receive_json_from())["type"] == "error"
    await ws.disconnect()


async def test_progress_from_the_log_reaches_the_list_and_the_jobs_socket(make_job, owner, outsider):
    job = await database_sync_to_async(make_job)()
    listing = await connect(owner)
    detail = await connect(owner, f"job={job.pk}")
    stranger = await connect(outsider)
    lines = [RawLine(line_no=1, ts=NOW, text="epoch 1/3 step 50/150 loss 0.036 lr 0.01")]
    await database_sync_to_async(ingest_lines)(job_id=job.pk, stream="master", attempt=1, lines=lines)
    for ws in (listing, detail):
        message = await ws.receive_json_from()
        assert message["type"] == "progress" and message["job"] == job.pk
        assert {k: message["progress"][k] for k in ("step", "total", "epoch", "loss", "lr")} == {
            "step": 50,
            "total": 150,
            "epoch": 1.0,
            "loss": 0.036,
            "lr": 0.01,
        }
    assert await stranger.receive_nothing(timeout=0.3)
    # A status change carries the progress too.
    await move(job.pk, JobStatus.RUNNING)
    assert (await next_job_message(listing))["job"]["progress"]["step"] == 50
    for ws in (listing, detail, stranger):
        await ws.disconnect()


async def test_a_removed_members_job_socket_closes_with_4403(make_job, owner, teammate, settings):
    settings.SOCKET_ACCESS_RECHECK = 0.2
    job = await database_sync_to_async(make_job)()
    ws = await connect(teammate, f"job={job.pk}")
    await database_sync_to_async(lambda: job.project.members.remove(teammate))()
    while True:
        output = await ws.receive_output()
        if output["type"] == "websocket.close":
            break
    assert output["code"] == 4403
