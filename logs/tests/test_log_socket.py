"""The log tab's WebSocket: backlog, live lines, reconnect, end, banners, access and bad input."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from channels.db import database_sync_to_async
from knox.models import AuthToken

from console.asgi import application
from harness.sockets import Communicator
from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus
from logs.services import RawLine, ingest_lines

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def add_lines(job_id: int, texts: list[str], *, attempt: int = 1, start: int = 1, stream: str = "master"):
    return ingest_lines(job_id=job_id, stream=stream, attempt=attempt, lines=[RawLine(line_no=start + i, ts=NOW, text=t) for i, t in enumerate(texts)])


def token_for(user) -> bytes:
    return f"Token {AuthToken.objects.create(user)[1]}".encode()


async def connect(job_id: int, user=None, query: str = "", headers=None):
    headers = list(headers or [])
    if user is not None:
        headers.append((b"authorization", await database_sync_to_async(token_for)(user)))
    communicator = Communicator(application, f"/ws/training-jobs/{job_id}/logs/{'?' + query if query else ''}", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def receive_until(communicator, kind: str) -> list[dict]:
    seen = []
    while True:
        message = await communicator.receive_json_from()
        seen.append(message)
        if message["type"] == kind:
            return seen


def texts_of(messages: list[dict]) -> list[str]:
    return [line["text"] for m in messages if m["type"] == "lines" for line in m["lines"]]


@pytest.fixture
def running_job(make_job):
    job = make_job()
    transition(job.pk, JobStatus.RUNNING)
    return job


async def test_it_sends_the_backlog_after_seq_then_live_lines(running_job, owner):
    await database_sync_to_async(add_lines)(running_job.pk, ["one", "two", "three"])
    ws = await connect(running_job.pk, owner, "stream=master&after=1")
    first = await ws.receive_json_from()
    assert first == {"type": "attempts", "banners": {}}
    backlog = await ws.receive_json_from()
    assert backlog["backlog"] is True
    assert [(ln["seq"], ln["text"]) for ln in backlog["lines"]] == [(2, "two"), (3, "three")]

    await database_sync_to_async(add_lines)(running_job.pk, ["four", "five"], start=4)
    live = await ws.receive_json_from()
    assert live["backlog"] is False
    assert [(ln["seq"], ln["text"]) for ln in live["lines"]] == [(4, "four"), (5, "five")]
    await ws.disconnect()


async def test_without_after_it_opens_on_the_tail(running_job, owner):
    await database_sync_to_async(add_lines)(running_job.pk, [f"line {i}" for i in range(50)])
    ws = await connect(running_job.pk, owner, "tail=10")
    await ws.receive_json_from()
    backlog = await ws.receive_json_from()
    assert [ln["text"] for ln in backlog["lines"]] == [f"line {i}" for i in range(40, 50)]
    await ws.disconnect()


async def test_a_reconnect_from_the_last_seq_has_no_gap_and_no_duplicate(running_job, owner):
    await database_sync_to_async(add_lines)(running_job.pk, ["a", "b"])
    ws = await connect(running_job.pk, owner, "after=0")
    messages = [await ws.receive_json_from(), await ws.receive_json_from()]
    last = messages[-1]["lines"][-1]["seq"]
    await ws.disconnect()
    # Lines arrive while the client is away, including a redelivered batch.
    await database_sync_to_async(add_lines)(running_job.pk, ["c", "d"], start=3)
    await database_sync_to_async(add_lines)(running_job.pk, ["c", "d"], start=3)
    ws = await connect(running_job.pk, owner, f"after={last}")
    await ws.receive_json_from()
    again = await ws.receive_json_from()
    assert texts_of(messages) + [ln["text"] for ln in again["lines"]] == ["a", "b", "c", "d"]
    await ws.disconnect()


async def test_live_lines_are_batched(running_job, owner):
    ws = await connect(running_job.pk, owner, "after=0")
    await ws.receive_json_from()
    await ws.receive_json_from()
    for i in range(20):
        await database_sync_to_async(add_lines)(running_job.pk, [f"l{i}"], start=i + 1)
    received: list[str] = []
    batches = 0
    while len(received) < 20:
        message = await ws.receive_json_from()
        batches += 1
        received.extend(ln["text"] for ln in message["lines"])
    assert received == [f"l{i}" for i in range(20)]
    assert batches < 20
    await ws.disconnect()


async def test_it_sends_a_closing_message_once_the_job_has_finished(running_job, owner):
    ws = await connect(running_job.pk, owner, "after=0")
    await ws.receive_json_from()
    await ws.receive_json_from()
    await database_sync_to_async(add_lines)(running_job.pk, ["last words"])
    await database_sync_to_async(transition)(running_job.pk, JobStatus.COMPLETED, reason="exit code 0")
    messages = await receive_until(ws, "end")
    assert texts_of(messages) == ["last words"]
    assert messages[-1] == {"type": "end", "status": "Completed"}
    assert (await ws.receive_output())["type"] == "websocket.close"


async def test_a_finished_jobs_socket_sends_the_backlog_and_closes(make_job, owner):
    job = await database_sync_to_async(make_job)()
    await database_sync_to_async(add_lines)(job.pk, ["done"])
    await database_sync_to_async(transition)(job.pk, JobStatus.STOPPED)
    ws = await connect(job.pk, owner, "after=0")
    messages = await receive_until(ws, "end")
    assert texts_of(messages) == ["done"]
    assert messages[-1]["status"] == "Stopped"


def make_failover_history(job_id: int) -> None:
    from jobs.models import JobEvent

    add_lines(job_id, ["Starting dataset initialization", "step 1", "step 2"], attempt=1)
    transition(job_id, JobStatus.FAILOVER_IN_PROGRESS, reason="run stopped (killed by SIGKILL)", attempt=1)
    transition(
        job_id,
        JobStatus.RUNNING,
        reason="attempt 2 on node-b GPU 0 after a GPU fault: Xid 79 on GPU 0: GPU has fallen off the bus on node-a",
        attempt=2,
    )
    add_lines(job_id, ["Starting dataset initialization", "step 2"], attempt=2)
    assert JobEvent.objects.filter(job_id=job_id, attempt=2).exists()


async def test_the_merged_stream_across_a_failover_is_in_order_with_the_banner(running_job, owner):
    await database_sync_to_async(make_failover_history)(running_job.pk)
    ws = await connect(running_job.pk, owner, "after=0")
    banners = await ws.receive_json_from()
    assert banners["banners"]["2"].startswith("attempt 2 on node-b") and "Xid 79" in banners["banners"]["2"]
    lines = (await ws.receive_json_from())["lines"]
    assert [(ln["attempt"], ln["text"]) for ln in lines] == [
        (1, "Starting dataset initialization"),
        (1, "step 1"),
        (1, "step 2"),
        (2, "Starting dataset initialization"),
        (2, "step 2"),
    ]
    assert [ln["seq"] for ln in lines] == [1, 2, 3, 4, 5]
    await ws.disconnect()


async def test_a_teammate_and_staff_may_watch_but_an_outsider_may_not(running_job, teammate, staff, outsider):
    for user in (teammate, staff):
        ws = await connect(running_job.pk, user)
        assert (await ws.receive_json_from())["type"] == "attempts"
        await ws.disconnect()
    ws = await connect(running_job.pk, outsider)
    closed = await ws.receive_output()
    assert closed == {"type": "websocket.close", "code": 4404, "reason": "no such training job"}


async def test_an_anonymous_socket_is_closed_with_4401(running_job):
    ws = await connect(running_job.pk)
    assert (await ws.receive_output())["code"] == 4401


async def test_the_session_cookie_authenticates_too(running_job, owner):
    from django.test import Client

    client = Client()
    await database_sync_to_async(client.force_login)(owner)
    cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
    ws = await connect(running_job.pk, headers=[(b"cookie", cookie), (b"host", b"127.0.0.1:8000"), (b"origin", b"http://127.0.0.1:8000")])
    assert (await ws.receive_json_from())["type"] == "attempts"
    await ws.disconnect()


async def test_a_cross_site_browser_socket_is_refused(running_job, owner):
    communicator = Communicator(application, f"/ws/training-jobs/{running_job.pk}/logs/", headers=[(b"origin", b"http://evil.example")])
    connected, _ = await communicator.connect()
    assert not connected


@pytest.mark.parametrize(
    "query, reason",
    [
        ("stream=../../etc", "stream must be master or worker-<n>"),
        ("after=-1", "after must be a non-negative integer seq"),
        ("after=abc", "after must be a non-negative integer seq"),
        ("tail=0", "tail must be an integer from 1 to 10000"),
    ],
)
async def test_bad_parameters_close_the_socket_with_4400_and_the_reason(running_job, owner, query, reason):
    ws = await connect(running_job.pk, owner, query)
    assert await ws.receive_output() == {"type": "websocket.close", "code": 4400, "reason": reason}


async def test_a_client_message_gets_an_error_not_a_crash(running_job, owner):
    ws = await connect(running_job.pk, owner, "after=0")
    await ws.receive_json_from()
    await ws.receive_json_from()
    await ws.send_to(text_data="not json {")
    assert (await ws.receive_json_from())["type"] == "error"
    await ws.disconnect()


async def test_a_backlog_larger_than_one_websocket_message_arrives_whole_in_several(running_job, owner):
    long_text = "x" * 400
    await database_sync_to_async(add_lines)(running_job.pk, [f"{i} {long_text}" for i in range(5000)])
    ws = await connect(running_job.pk, owner, "tail=5000")
    await ws.receive_json_from()
    received: list[dict] = []
    messages = 0
    while len(received) < 5000:
        message = await ws.receive_json_from()
        messages += 1
        assert len(json.dumps(message)) < 1024 * 1024
        received.extend(message["lines"])
    assert [ln["seq"] for ln in received] == list(range(1, 5001))
    assert messages > 1
    await ws.disconnect()


async def test_a_removed_members_socket_closes_with_4403(running_job, owner, teammate, settings):
    settings.SOCKET_ACCESS_RECHECK = 0.2
    ws = await connect(running_job.pk, teammate)
    assert (await ws.receive_json_from())["type"] == "attempts"
    await database_sync_to_async(lambda: running_job.project.members.remove(teammate))()
    while True:
        output = await ws.receive_output()
        if output["type"] == "websocket.close":
            break
    assert output["code"] == 4403


async def test_a_live_message_lost_on_its_way_is_filled_from_the_database(running_job, owner, monkeypatch):
    """A channel layer drops a group message to a full channel without a word: the socket sees
    the gap in the seqs and sends the missing lines from the database, each once and in order."""
    import logs.services

    await database_sync_to_async(add_lines)(running_job.pk, ["one", "two"])
    ws = await connect(running_job.pk, owner, "stream=master&after=0")
    await receive_until(ws, "lines")
    real_publish = logs.services.publish
    dropped = []
    monkeypatch.setattr(logs.services, "publish", lambda group, payload: dropped.append(payload))
    await database_sync_to_async(add_lines)(running_job.pk, [f"lost {i}" for i in range(3000)], start=3)
    monkeypatch.setattr(logs.services, "publish", real_publish)
    assert len(dropped) == 1
    await database_sync_to_async(add_lines)(running_job.pk, ["after the loss"], start=3003)
    received: list[dict] = []
    while len(texts_of(received)) < 3001:
        received.append(await ws.receive_json_from())
    seqs = [line["seq"] for m in received if m["type"] == "lines" for line in m["lines"]]
    assert seqs == list(range(3, 3004))
    assert texts_of(received)[-1] == "after the loss"
    await ws.disconnect()


async def test_end_comes_after_every_stored_line(running_job, owner, monkeypatch):
    """Lines stored but never published (lost on the way) still arrive before ``end``."""
    import logs.services

    ws = await connect(running_job.pk, owner, "stream=master&after=0")
    await receive_until(ws, "lines")
    monkeypatch.setattr(logs.services, "publish", lambda group, payload: None)
    await database_sync_to_async(add_lines)(running_job.pk, [f"tail {i}" for i in range(4500)])
    monkeypatch.undo()
    await database_sync_to_async(transition)(running_job.pk, JobStatus.COMPLETED)
    messages = await receive_until(ws, "end")
    assert texts_of(messages) == [f"tail {i}" for i in range(4500)]
    await ws.disconnect()
