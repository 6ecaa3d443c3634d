"""The embedded console's local relay: live updates from other processes on the same machine.

The in-memory channel layer lives only inside the console's server process, so a status changed
by another process (``manage.py job stop``, ``inject_fault``, an operator's ORM script) would be
published into that process's own, empty layer. The server listens on a Unix socket in
``CONSOLE_VAR_DIR`` (mode 0600: only the console's user connects; jobs run sandboxed without
``var/``); other processes keep one connection each and send one notice per line::

    {"group": "job-7", "message": {"type": "job.status", ...}, "db": "<its database>"}\\n

The server forwards each valid notice to its layer and answers ``ok`` or ``error: <why>`` per
line; the sender waits for the answer before its next notice, so notices keep their order. A
notice about another database (a test run beside a console started from the same checkout) is
refused quietly. Invalid JSON, an unknown group, a message that is not a dict with a ``job.*`` /
``log.*`` type, or a line over ``MAX_NOTICE_BYTES`` is dropped with a log line; the connection
ends on an oversized line, the server goes on. Live updates are best effort: the database holds
the truth and pages catch up from a snapshot when they reconnect.

Scale-out (Redis layer) needs none of this: every process publishes to Redis itself.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import os
import re
import socket
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

SOCKET_NAME = "live.sock"
MAX_NOTICE_BYTES = 1 << 20
# How long a sender waits to connect, and for the server's answer, before giving up.
TIMEOUT = 0.5
# Senders keep their connection (one per process); a connection past this many is refused.
MAX_CONNECTIONS = 128
# sockaddr_un.sun_path holds 108 bytes, the terminating NUL included.
MAX_PATH_BYTES = 107

# The groups jobs.realtime names (jobs, job-<id>, job-<id>-metrics, job-<id>-log-<stream>) and the
# message types their consumers handle; never "websocket.*", which would act as the client itself.
GROUP_NAME = re.compile(r"jobs|job-[1-9][0-9]{0,17}(?:-metrics|-log-[A-Za-z0-9_.-]{1,32})?")
MESSAGE_TYPE = re.compile(r"(?:job|log)\.[a-z_]{1,40}")

Deliver = Callable[[str, dict[str, Any]], Awaitable[None]]


class BadNotice(ValueError):
    """A line on the relay socket that is not a notice to forward; the message says why."""


def socket_path(var_dir: Path | str) -> Path:
    return Path(var_dir) / SOCKET_NAME


def encode_notice(group: str, message: dict[str, Any], database: str = "") -> bytes:
    line = json.dumps({"group": group, "message": message, "db": database}, separators=(",", ":")).encode() + b"\n"
    if len(line) > MAX_NOTICE_BYTES:
        raise BadNotice(f"the notice is {len(line)} bytes, over {MAX_NOTICE_BYTES}")
    return line


class OtherDatabase(BadNotice):
    """A well-formed notice about another database's jobs."""


def parse_notice(line: bytes, database: str | None = None) -> tuple[str, dict[str, Any]]:
    try:
        notice = json.loads(line)
    except ValueError:
        raise BadNotice("not JSON") from None
    if not isinstance(notice, dict):
        raise BadNotice("not a JSON object")
    group, message = notice.get("group"), notice.get("message")
    if not isinstance(group, str) or not GROUP_NAME.fullmatch(group):
        raise BadNotice(f"unknown group {str(group)[:80]!r}")
    if not isinstance(message, dict) or not isinstance(message.get("type"), str) or not MESSAGE_TYPE.fullmatch(message["type"]):
        raise BadNotice("the message must be an object whose type is job.* or log.*")
    if database is not None and notice.get("db") != database:
        raise OtherDatabase("a notice about another database")
    return group, message


# --- the sender (any process) -------------------------------------------------------------------
class Sender:
    """One connection per process, kept open: a script that changes many jobs sends its notices
    in order, each answered before the next, so a busy server slows the sender instead of
    losing notices. Thread-safe; a forked child opens its own connection."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sock: socket.socket | None = None
        self.path: Path | None = None
        self.pid = 0

    def send(self, path: Path, line: bytes) -> bool:
        with self.lock:
            for _ in range(2):
                try:
                    sock = self.connection(path)
                except OSError:
                    return False  # no console serves this var dir: nothing is lost, pages catch up
                try:
                    sock.sendall(line)
                except OSError:
                    # The server closed this connection (it restarted) before reading the
                    # notice: once more on a fresh one.
                    self.forget()
                    continue
                try:
                    answer = self.answer(sock)
                except OSError:
                    self.forget()
                    return False  # it may have arrived: never sent twice
                return answer == b"ok"
            return False

    def connection(self, path: Path) -> socket.socket:
        if self.sock is not None and self.pid == os.getpid() and self.path == path:
            return self.sock
        self.forget()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(TIMEOUT)
        try:
            sock.connect(str(path))
        except OSError:
            sock.close()
            raise
        self.sock, self.path, self.pid = sock, path, os.getpid()
        return sock

    def forget(self) -> None:
        if self.sock is not None and self.pid == os.getpid():
            self.sock.close()
        self.sock = None

    @staticmethod
    def answer(sock: socket.socket) -> bytes:
        received = b""
        while not received.endswith(b"\n"):
            chunk = sock.recv(256)
            if not chunk:
                raise ConnectionResetError("the relay closed the connection")
            received += chunk
        return received.strip()


_sender = Sender()


def send(path: Path, group: str, message: dict[str, Any], database: str = "") -> bool:
    """Hand one notice to the server listening on ``path``; True once it has forwarded it."""
    try:
        line = encode_notice(group, message, database)
    except (TypeError, ValueError) as exc:
        logger.warning("live relay: not sending to %s: %s", group, exc)
        return False
    return _sender.send(Path(path), line)


# --- the server (the console's server process) --------------------------------------------------
class Relay:
    """The listening side, inside the server's event loop: ``await Relay(path, deliver).start()``.
    With ``database``, only notices that name the same database are forwarded."""

    def __init__(self, path: Path, deliver: Deliver, *, database: str | None = None) -> None:
        self.path = Path(path)
        self.deliver = deliver
        self.database = database
        self.server: asyncio.AbstractServer | None = None
        self.inode: int | None = None
        self.connections = 0
        self.writers: set[asyncio.StreamWriter] = set()
        self.forwarded = 0
        self.dropped = 0

    async def start(self) -> bool:
        """Listen on the path (replacing a dead server's socket file); False if it cannot."""
        temporary = self.path.with_name(f"{SOCKET_NAME}.{os.getpid()}")
        if len(os.fsencode(str(temporary))) > MAX_PATH_BYTES:
            logger.warning("live relay: %s is too long for a Unix socket; other processes' changes reach pages on reconnect only", self.path)
            return False
        if await asyncio.to_thread(self.answers):
            logger.warning("live relay: another console already serves %s; this one takes no notices", self.path)
            return False
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            temporary.unlink(missing_ok=True)
            sock.bind(str(temporary))
            os.chmod(temporary, 0o600)
            sock.listen(MAX_CONNECTIONS)
            self.inode = os.stat(temporary).st_ino
            # The rename puts a ready socket in place at once and replaces a stale file.
            os.replace(temporary, self.path)
            self.server = await asyncio.start_unix_server(self.serve, sock=sock, limit=MAX_NOTICE_BYTES + 1)
        except OSError as exc:
            sock.close()
            temporary.unlink(missing_ok=True)
            logger.warning("live relay: cannot listen on %s: %s", self.path, exc)
            return False
        atexit.register(self.remove_socket_file)
        logger.info("live relay: listening on %s", self.path)
        return True

    def answers(self) -> bool:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(TIMEOUT)
            try:
                probe.connect(str(self.path))
            except OSError:
                return False
        return True

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            for writer in list(self.writers):  # senders keep theirs open; they reconnect
                writer.close()
            await self.server.wait_closed()
            self.server = None
        self.remove_socket_file()

    def remove_socket_file(self) -> None:
        """Remove the socket file if it is still ours (a newer server may have replaced it)."""
        try:
            if self.inode is not None and os.stat(self.path).st_ino == self.inode:
                self.path.unlink()
        except OSError:
            pass

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.writers.add(writer)
        try:
            if self.connections > MAX_CONNECTIONS:
                await self.answer(writer, self.drop("too many connections"))
                return
            while True:
                try:
                    line = await reader.readline()
                except ValueError:  # over the reader's limit; the stream's framing is lost
                    await self.answer(writer, self.drop(f"a line over {MAX_NOTICE_BYTES} bytes; connection closed"))
                    return
                except OSError:
                    return
                if not line:
                    return
                if not line.endswith(b"\n"):
                    self.drop("an incomplete last line")  # a sender cut off mid-write sends it again
                    return
                if not line.strip():
                    continue
                try:
                    group, message = parse_notice(line, self.database)
                except OtherDatabase as exc:
                    logger.debug("live relay: %s", exc)
                    await self.answer(writer, f"error: {exc}")
                    continue
                except BadNotice as exc:
                    await self.answer(writer, self.drop(str(exc)))
                    continue
                try:
                    await self.deliver(group, message)
                except Exception:
                    logger.exception("live relay: could not forward to %s", group)
                    await self.answer(writer, "error: not forwarded")
                    continue
                self.forwarded += 1
                await self.answer(writer, "ok")
        finally:
            self.connections -= 1
            self.writers.discard(writer)
            writer.close()

    def drop(self, why: str) -> str:
        self.dropped += 1
        logger.warning("live relay: dropped a notice: %s", why)
        return f"error: {why}"

    @staticmethod
    async def answer(writer: asyncio.StreamWriter, text: str) -> None:
        try:
            writer.write(text.encode() + b"\n")
            await writer.drain()
        except OSError:
            pass  # the sender did not wait for the answer
