"""A lost node's agent, back, delivers the lines its run wrote while the next attempt ran
elsewhere: the merged log still reads all of attempt 1, then attempt 2 (a banner between them in
the viewer), each line once — in the database, the download, the log socket from ``after=0``, and
for a viewer that was following the tail when the late lines came."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone
from knox.models import AuthToken
from rest_framework.test import APIClient

from agent import runfiles
from agent.output import OutputReader
from agent.processes import run_dir
from console.asgi import application
from harness.sockets import Communicator
from jobs.models import AttemptNode, JobAttempt, JobEvent, Node
from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus
from logs.models import LogLine, LogVolume
from logs.services import RawLine, ingest_lines

pytestmark = pytest.mark.django_db(transaction=True)

T0 = datetime(2026, 12, 3, 12, 0, tzinfo=UTC).timestamp()
BANNER = "attempt 2 on node-y GPU 0 after node node-x lost (no heartbeat for 90s)"


class LostNodeRun:
    """Attempt 1 on node-x (its agent away, then back) and attempt 2 on node-y, each delivered
    by its own agent's ``OutputReader`` from the run's output file, as the node agents do."""

    def __init__(self, job) -> None:
        self.job = job
        self.parts = {}
        self.writers = {}
        self.readers = {1: OutputReader(), 2: OutputReader()}
        for number, node in ((1, "node-x"), (2, "node-y")):
            attempt = JobAttempt.objects.create(job=job, number=number, state=JobAttempt.State.RUNNING, started_at=timezone.now())
            part = AttemptNode.objects.create(attempt=attempt, node=Node.objects.create(name=node, simulated=True), rank=0, runner_pid=1)
            directory = run_dir(part)
            directory.mkdir(parents=True)
            self.parts[number] = part
            self.writers[number] = runfiles.OutputWriter(directory)

    def prints(self, number: int, count: int) -> None:
        writer = self.writers[number]
        for _ in range(count):
            writer.emit(f"attempt {number} line {writer.count + 1}", T0 + writer.count)
        writer.flush()  # as the runner does before it waits for more

    def delivers(self, number: int, *, complete: bool = False) -> None:
        part = AttemptNode.objects.select_related("attempt").get(pk=self.parts[number].pk)
        while not self.readers[number].drain(part, run_dir(part), complete=complete):
            pass

    def node_x_lost(self) -> None:
        # What the sweep records: attempt 1's part closed without an exit, attempt 2 started.
        AttemptNode.objects.filter(pk=self.parts[1].pk).update(ended_at=timezone.now())
        JobAttempt.objects.filter(pk=self.parts[1].attempt_id).update(state=JobAttempt.State.EXITED, ended_at=timezone.now())
        JobEvent.objects.create(job=self.job, attempt=2, from_status="Pending", to_status="Running", reason=BANNER)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


@pytest.fixture
def lost_node_run(make_job):
    job = make_job()
    transition(job.pk, JobStatus.RUNNING)
    run = LostNodeRun(job)
    yield run
    run.close()


def expected(attempt_1: int, attempt_2: int) -> list[str]:
    return [f"attempt 1 line {n}" for n in range(1, attempt_1 + 1)] + [f"attempt 2 line {n}" for n in range(1, attempt_2 + 1)]


def stored(job) -> list[tuple[int, str]]:
    return list(LogLine.objects.filter(job=job, stream="master").order_by("seq").values_list("seq", "text"))


def the_lost_node_story(run: LostNodeRun) -> None:
    """The issue's figures: 472 lines of attempt 1 stored, node-x lost, attempt 2's first 83
    lines, then node-x's agent back with the 1,655 lines its run wrote meanwhile, then more of
    attempt 2."""
    run.prints(1, 472)
    run.delivers(1)
    run.node_x_lost()
    run.prints(2, 83)
    run.delivers(2)
    run.prints(1, 1655)
    run.delivers(1, complete=True)
    run.prints(2, 20)
    run.delivers(2)


def token_for(user) -> bytes:
    return f"Token {AuthToken.objects.create(user)[1]}".encode()


async def open_socket(job_id: int, user, query: str) -> Communicator:
    headers = [(b"authorization", await database_sync_to_async(token_for)(user))]
    communicator = Communicator(application, f"/ws/training-jobs/{job_id}/logs/?{query}", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def hear_until(communicator: Communicator, viewer: Viewer, shown: list[str], wait: float = 60) -> list[dict]:
    """Feed the socket's messages to ``viewer`` until it shows ``shown``; the messages heard. No
    quiet period decides when it is over (a loaded machine sends late): the text does. ``wait``
    only bounds a failure."""
    heard: list[dict] = []
    while viewer.reads() != shown:
        try:
            message = await communicator.receive_json_from(timeout=wait)
        except TimeoutError:
            raise AssertionError(f"after {len(heard)} messages the viewer shows {len(viewer.reads())} lines, not the {len(shown)} expected") from None
        heard.append(message)
        viewer.hears([message])
    return heard


class Viewer:
    """What the log tab's viewer holds, by the socket's rules (``logviewer/tail.js``): lines past
    the newest held join the end; ``inserted`` drops what it holds from that seq on."""

    def __init__(self) -> None:
        self.lines: list[dict] = []
        self.banners: dict[str, str] = {}

    def hears(self, messages: list[dict]) -> None:
        for message in messages:
            if message["type"] == "attempts":
                self.banners = message["banners"]
            elif message["type"] == "inserted":
                self.lines = [line for line in self.lines if line["seq"] < message["from_seq"]]
            elif message["type"] == "lines":
                newest = self.lines[-1]["seq"] if self.lines else 0
                self.lines += [line for line in message["lines"] if line["seq"] > newest]

    def reads(self) -> list[str]:
        """The text as shown: a banner where the attempt changes."""
        shown, attempt = [], None
        for line in self.lines:
            if attempt is not None and line["attempt"] != attempt:
                shown.append(f"-- {self.banners.get(str(line['attempt']), '')} --")
            attempt = line["attempt"]
            shown.append(line["text"])
        return shown


def test_late_lines_of_an_ended_attempt_are_stored_in_its_place_each_once(lost_node_run, owner):
    the_lost_node_story(lost_node_run)
    rows = stored(lost_node_run.job)
    assert [text for _, text in rows] == expected(472 + 1655, 83 + 20)
    assert [seq for seq, _ in rows] == list(range(1, len(rows) + 1)), "contiguous seqs"
    assert LogVolume.objects.get(job=lost_node_run.job).lines == len(rows)

    client = APIClient()
    client.force_authenticate(owner)
    response = client.get(f"/api/v1/training-jobs/{lost_node_run.job.pk}/logs/download/?stream=master")
    assert response.status_code == 200
    assert b"".join(response.streaming_content).decode().splitlines() == expected(2127, 103)


@pytest.mark.asyncio
async def test_the_log_socket_from_after_0_reads_attempt_1_banner_attempt_2(lost_node_run, owner):
    await database_sync_to_async(the_lost_node_story)(lost_node_run)
    viewer = Viewer()
    ws = await open_socket(lost_node_run.job.pk, owner, "stream=master&after=0")
    await hear_until(ws, viewer, expected(2127, 0) + [f"-- {BANNER} --"] + [f"attempt 2 line {n}" for n in range(1, 104)])
    await ws.disconnect()
    assert [line["seq"] for line in viewer.lines] == list(range(1, 2127 + 103 + 1))


@pytest.mark.asyncio
async def test_a_viewer_following_the_tail_gets_the_late_lines_once_in_their_place(lost_node_run, owner):
    run = lost_node_run
    await database_sync_to_async(run.prints)(1, 472)
    await database_sync_to_async(run.delivers)(1)
    await database_sync_to_async(run.node_x_lost)()
    await database_sync_to_async(run.prints)(2, 83)
    await database_sync_to_async(run.delivers)(2)

    viewer = Viewer()
    ws = await open_socket(run.job.pk, owner, "stream=master")
    await hear_until(ws, viewer, expected(472, 0) + [f"-- {BANNER} --"] + [f"attempt 2 line {n}" for n in range(1, 84)])

    await database_sync_to_async(run.prints)(1, 1655)
    await database_sync_to_async(run.delivers)(1, complete=True)
    late = await hear_until(ws, viewer, expected(2127, 0) + [f"-- {BANNER} --"] + [f"attempt 2 line {n}" for n in range(1, 84)])
    assert {"type": "inserted", "from_seq": 473} in late
    await database_sync_to_async(run.prints)(2, 20)
    await database_sync_to_async(run.delivers)(2)
    await hear_until(ws, viewer, expected(2127, 0) + [f"-- {BANNER} --"] + [f"attempt 2 line {n}" for n in range(1, 104)])
    await ws.disconnect()
    assert [line["seq"] for line in viewer.lines] == list(range(1, 2127 + 103 + 1))


def test_a_log_stored_before_attempt_starts_were_kept_takes_late_lines_in_place_too(make_job):
    job = make_job()
    now = datetime.fromtimestamp(T0, tz=UTC)
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=[RawLine(n, now, f"attempt 1 line {n}") for n in range(1, 11)])
    ingest_lines(job_id=job.pk, stream="master", attempt=2, lines=[RawLine(n, now, f"attempt 2 line {n}") for n in range(1, 6)])
    LogVolume.objects.filter(job=job).update(starts={})  # as the rows of a log from before migration 0005 leave it
    ingest_lines(job_id=job.pk, stream="master", attempt=1, lines=[RawLine(n, now, f"attempt 1 line {n}") for n in range(11, 16)])
    assert [text for _, text in stored(job)] == expected(15, 5)
    assert LogVolume.objects.get(job=job).starts == {"master": {"1": 1, "2": 16}}
