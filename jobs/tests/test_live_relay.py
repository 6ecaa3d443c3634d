"""The embedded console's local relay (jobs.live_relay): what another process publishes reaches the
server's layer; junk is answered with an error and dropped; a dead server's socket file is replaced;
no server listening costs a publisher nothing."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import stat
import tempfile
import threading
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from jobs import live_relay, realtime
from jobs.live_relay import MAX_NOTICE_BYTES, Relay, socket_path


@pytest.fixture
def var_dir():
    # Short on purpose: a Unix socket's path holds at most 107 bytes.
    path = Path(tempfile.mkdtemp(prefix="relay-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


class ServerLoop:
    """An event loop in a thread standing in for the console server's, with relays in it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.delivered: list[tuple[str, dict]] = []
        self.arrived = threading.Condition()
        self.relays: list[Relay] = []
        threading.Thread(target=self.loop.run_forever, daemon=True).start()

    async def deliver(self, group: str, message: dict) -> None:
        with self.arrived:
            self.delivered.append((group, message))
            self.arrived.notify_all()

    def start(self, path: Path) -> tuple[Relay, bool]:
        relay = Relay(path, self.deliver)
        started = asyncio.run_coroutine_threadsafe(relay.start(), self.loop).result(30)
        self.relays.append(relay)
        return relay, started

    def wait_for(self, count: int) -> list[tuple[str, dict]]:
        with self.arrived:
            assert self.arrived.wait_for(lambda: len(self.delivered) >= count, timeout=30), self.delivered
            return list(self.delivered)

    def stop(self) -> None:
        for relay in self.relays:
            asyncio.run_coroutine_threadsafe(relay.close(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)


@pytest.fixture
def server():
    loop = ServerLoop()
    yield loop
    loop.stop()


def talk(path: Path, data: bytes) -> list[str]:
    """Write ``data`` to the relay socket, half-close, and return the server's answer lines."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server closed first (an oversized line): its answer is still there to read
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer.decode().splitlines()


def line(notice) -> bytes:
    return json.dumps(notice).encode() + b"\n"


STATUS = {"type": "job.status", "job": 5, "from": "Running", "status": "Stopping", "reason": "maintenance"}


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_a_publish_from_a_process_that_is_not_the_server_reaches_the_servers_relay(server, var_dir, settings, monkeypatch):
    settings.VAR_DIR = var_dir
    monkeypatch.setattr(realtime, "_server_loop", None)
    _, started = server.start(socket_path(var_dir))
    assert started

    realtime.publish(realtime.job_group(5), STATUS)
    realtime.publish(realtime.jobs_group(), STATUS)

    assert server.wait_for(2) == [("job-5", STATUS), ("jobs", STATUS)]


def test_without_a_server_a_publish_still_reaches_this_processs_own_layer(var_dir, settings, monkeypatch):
    settings.VAR_DIR = var_dir
    monkeypatch.setattr(realtime, "_server_loop", None)
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)("job-6", channel)
    try:
        assert live_relay.send(socket_path(var_dir), "job-6", STATUS) is False
        realtime.publish("job-6", STATUS)
        assert async_to_sync(layer.receive)(channel) == STATUS
    finally:
        async_to_sync(layer.group_discard)("job-6", channel)


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_the_socket_is_private_to_the_console_user(server, var_dir):
    _, started = server.start(socket_path(var_dir))
    assert started
    info = os.stat(socket_path(var_dir))
    assert stat.S_ISSOCK(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.getuid()


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_each_bad_line_is_answered_with_why_and_dropped_while_good_lines_around_it_are_forwarded(server, var_dir, caplog):
    path = socket_path(var_dir)
    server.start(path)
    lines = [
        line({"group": "job-1", "message": STATUS}),
        b"{not json\n",
        b'"a string"\n',
        line({"group": "job-0", "message": STATUS}),
        line({"group": "jobs; DROP", "message": STATUS}),
        line({"group": "job-1-log-" + "m" * 40, "message": STATUS}),
        line({"group": "job-1", "message": {"type": "websocket.disconnect"}}),
        line({"group": "job-1", "message": {"no": "type"}}),
        line({"group": "job-1", "message": ["job.status"]}),
        line({"group": "job-1-log-master", "message": {"type": "log.lines", "lines": []}}),
    ]
    answers = talk(path, b"".join(lines))

    assert answers[0] == "ok" and answers[-1] == "ok"
    assert answers[1:-1] == [
        "error: not JSON",
        "error: not a JSON object",
        "error: unknown group 'job-0'",
        "error: unknown group 'jobs; DROP'",
        f"error: unknown group 'job-1-log-{'m' * 40}'",
        *["error: the message must be an object whose type is job.* or log.*"] * 3,
    ]
    assert server.wait_for(2) == [("job-1", STATUS), ("job-1-log-master", {"type": "log.lines", "lines": []})]
    assert caplog.text.count("live relay: dropped a notice") == 8


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_a_line_over_the_cap_ends_its_connection_and_the_server_goes_on(server, var_dir):
    path = socket_path(var_dir)
    relay, _ = server.start(path)
    huge = line({"group": "job-1", "message": {"type": "job.status", "pad": "x" * MAX_NOTICE_BYTES}})
    assert talk(path, huge) == [f"error: a line over {MAX_NOTICE_BYTES} bytes; connection closed"]
    # The sender refuses to send one at all.
    assert live_relay.send(path, "job-1", {"type": "job.status", "pad": "x" * MAX_NOTICE_BYTES}) is False

    assert live_relay.send(path, "job-1", STATUS) is True
    assert server.wait_for(1) == [("job-1", STATUS)]
    assert relay.dropped == 1 and relay.forwarded == 1


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_a_dead_servers_socket_file_is_replaced(server, var_dir):
    path = socket_path(var_dir)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(path))
    stale.close()  # the file stays, nobody listens: what a crashed server leaves behind
    assert live_relay.send(path, "job-1", STATUS) is False

    _, started = server.start(path)

    assert started
    assert live_relay.send(path, "job-1", STATUS) is True
    assert server.wait_for(1) == [("job-1", STATUS)]


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_a_second_server_on_the_same_var_dir_leaves_the_first_one_serving(server, var_dir):
    path = socket_path(var_dir)
    first, started = server.start(path)
    assert started
    second, started_again = server.start(path)
    assert not started_again

    assert live_relay.send(path, "jobs", STATUS) is True
    server.wait_for(1)
    assert first.forwarded == 1 and second.forwarded == 0


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_servers_with_their_own_var_dirs_do_not_collide(server, var_dir):
    other = Path(tempfile.mkdtemp(prefix="relay-"))
    try:
        one, _ = server.start(socket_path(var_dir))
        two, started = server.start(socket_path(other))
        assert started
        assert live_relay.send(socket_path(other), "jobs", STATUS)
        server.wait_for(1)
        assert (one.forwarded, two.forwarded) == (0, 1)
    finally:
        shutil.rmtree(other, ignore_errors=True)


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_closing_removes_the_socket_file_only_while_it_is_still_its_own(server, var_dir):
    path = socket_path(var_dir)
    relay, _ = server.start(path)
    asyncio.run_coroutine_threadsafe(relay.close(), server.loop).result(30)
    assert not path.exists()

    older, _ = server.start(path)
    path.unlink()
    newer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    newer.bind(str(path))  # another server's socket now has the name
    try:
        asyncio.run_coroutine_threadsafe(older.close(), server.loop).result(30)
        assert stat.S_ISSOCK(os.stat(path).st_mode)
    finally:
        newer.close()


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_a_var_dir_too_deep_for_a_unix_socket_is_refused_with_a_warning(server, var_dir, caplog):
    deep = var_dir / ("d" * 100)
    _, started = server.start(socket_path(deep))
    assert not started
    assert "too long for a Unix socket" in caplog.text


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_a_notice_about_another_database_is_refused_quietly(server, var_dir, caplog):
    """A test run next to a console started from the same checkout shares its var dir."""
    path = var_dir / "live.sock"
    relay = Relay(path, server.deliver, database="/srv/console/var/console.sqlite3")
    assert asyncio.run_coroutine_threadsafe(relay.start(), server.loop).result(30)
    server.relays.append(relay)

    answers = talk(
        path,
        line({"group": "jobs", "message": STATUS, "db": "test_console"}) + line({"group": "jobs", "message": STATUS, "db": "/srv/console/var/console.sqlite3"}),
    )

    assert answers == ["error: a notice about another database", "ok"]
    assert server.wait_for(1) == [("jobs", STATUS)]
    assert "dropped" not in caplog.text


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_a_script_changing_many_jobs_in_a_row_gets_every_notice_through_in_order(server, var_dir):
    path = socket_path(var_dir)
    server.start(path)
    notices = [{"type": "job.status", "job": n, "from": "Running", "status": "Stopping"} for n in range(1, 501)]

    assert all(live_relay.send(path, f"job-{m['job']}", m) for m in notices)

    assert server.wait_for(500) == [(f"job-{m['job']}", m) for m in notices]


@pytest.mark.slow  # the relay's server thread and Unix sockets
def test_after_the_console_restarts_the_next_notice_goes_to_the_new_one(server, var_dir):
    path = socket_path(var_dir)
    old, _ = server.start(path)
    assert live_relay.send(path, "jobs", STATUS)
    asyncio.run_coroutine_threadsafe(old.close(), server.loop).result(30)
    new, started = server.start(path)
    assert started

    assert live_relay.send(path, "jobs", STATUS)

    server.wait_for(2)
    assert (old.forwarded, new.forwarded) == (1, 1)
