"""The memory where a node's agent holds other nodes' runs' snapshots (checkpointless failover,
``agent.checkpointless``), and the HTTP door other agents reach it by.

One store and one server per agent process (the embedded console's agent serves every node from
it; a scale-out node's agent its own node). The server listens on ``REPLICA_ADDRESS`` (the node's
address: jobs never reach it, their networks are their own; ``docs/security.md``) and answers only
a request signed by another agent of this console: an HMAC of the method, the path and the time
with a key derived from ``SECRET_KEY`` (``replica_signature``), no more than ``SIGNATURE_SKEW_S``
old. Paths: ``PUT`` / ``GET /replicas/<job>/<rank>/<step>`` (an archive's bytes), ``DELETE
/replicas/<job>``. The store keeps ``REPLICAS_KEPT`` steps per rank, and never more bytes for a
job than its memory limit (the replica counts against the job's memory, on this node; the sending
agent names it, signed with the path). The server touches no database.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import logging
import re
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from django.conf import settings
from django.utils.crypto import salted_hmac

logger = logging.getLogger(__name__)

SIGNATURE_SKEW_S = 60
TIMEOUT_S = 10.0
PATH = re.compile(r"^/replicas/(\d{1,12})(?:/(\d{1,5})/(\d{1,18})(?:\?limit=(\d{1,15})&keep_from=(\d{1,18}))?)?$")
MAX_HELD_PER_RANK = 16  # steps of one rank held at once, whatever the ranks' spread
MAX_REPLICA_BYTES = 64 << 30  # one archive; the job's memory limit bounds it first


class ReplicaUnavailable(OSError):
    """A replica could not be stored or fetched; the message says why."""


def within_cap(steps: list[int]) -> list[int]:
    """``steps`` (ascending; the first is the newest step every rank has) cut to
    ``MAX_HELD_PER_RANK``: the first and the newest. A rank whose run went on snapshotting after
    another rank's node failed (for 6.7 s in one CI run) must not push out the one step a resume
    can use."""
    return steps if len(steps) <= MAX_HELD_PER_RANK else [steps[0], *steps[-(MAX_HELD_PER_RANK - 1) :]]


def replica_signature(method: str, path: str, when: int) -> str:
    return salted_hmac("satrain.replica", f"{method} {path} {when}", algorithm="sha256").hexdigest()


def signed(method: str, path: str) -> str:
    when = int(time.time())
    return f"{when}:{replica_signature(method, path, when)}"


def signature_ok(method: str, path: str, header: str) -> bool:
    when, _, digest = header.partition(":")
    if not when.isdigit() or abs(time.time() - int(when)) > SIGNATURE_SKEW_S:
        return False
    return hmac.compare_digest(digest, replica_signature(method, path, int(when)))


class ReplicaStore:
    """Replicas by (job, rank): their newest ``kept`` steps' archives, newest last."""

    def __init__(self, kept: int) -> None:
        self.kept = max(1, kept)
        self.lock = threading.Lock()
        self.held: dict[tuple[int, int], OrderedDict[int, bytes]] = {}

    def put(self, job: int, rank: int, step: int, data: bytes, *, job_limit: int, keep_from: int | None = None) -> None:
        """Hold ``data``; drop the rank's steps before ``keep_from`` (None: all but the newest
        ``kept``), and never more than ``MAX_HELD_PER_RANK``: past it, ``keep_from`` itself (the
        newest step every rank has) and the newest ones stay (``within_cap``). Steps newer than
        ``step`` go too: a rank's steps only grow within a run, so they were a failed attempt's,
        which ran on past the step the new attempt resumed from."""
        with self.lock:
            steps = self.held.setdefault((job, rank), OrderedDict())
            steps[step] = data
            ordered = sorted(s for s in steps if s <= step)
            kept = within_cap([s for s in ordered if s >= keep_from] if keep_from is not None else ordered[-self.kept :])
            for old in set(steps) - set(kept):
                del steps[old]
            if self._job_bytes(job) > job_limit:
                del steps[step]
                raise ReplicaUnavailable(f"the job's replicas would hold more than its memory limit ({job_limit >> 20} MiB) on this node")

    def get(self, job: int, rank: int, step: int) -> bytes | None:
        with self.lock:
            steps = self.held.get((job, rank))
            return None if steps is None else steps.get(step)

    def drop_job(self, job: int) -> int:
        with self.lock:
            keys = [k for k in self.held if k[0] == job]
            freed = sum(len(d) for k in keys for d in self.held[k].values())
            for key in keys:
                del self.held[key]
            return freed

    def jobs(self) -> set[int]:
        with self.lock:
            return {job for job, _ in self.held}

    def bytes_held(self) -> int:
        with self.lock:
            return sum(len(d) for steps in self.held.values() for d in steps.values())

    def _job_bytes(self, job: int) -> int:
        return sum(len(d) for (j, _), steps in self.held.items() if j == job for d in steps.values())


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        logger.debug("replica server: " + format, *args)

    def _answer(self, status: int, body: bytes = b"", reason: str = "") -> None:
        payload = body or reason.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _route(self) -> tuple[int, int | None, int | None, int, int | None] | None:
        match = PATH.match(self.path)
        if match is None or not signature_ok(self.command, self.path, self.headers.get("X-Replica-Signature", "")):
            self._answer(403, reason="refused")
            return None
        job, rank, step, limit, keep_from = match.groups()
        number = lambda text: int(text) if text is not None else None  # noqa: E731
        return int(job), number(rank), number(step), int(limit or 0), number(keep_from)

    def do_PUT(self) -> None:
        route = self._route()
        if route is None:
            return
        job, rank, step, limit, keep_from = route
        length = int(self.headers.get("Content-Length") or -1)
        if rank is None or step is None or not 0 < length <= min(MAX_REPLICA_BYTES, limit):
            self._answer(400, reason="a replica's archive is needed")
            return
        data = self.rfile.read(length)
        if len(data) != length:
            self._answer(400, reason="short body")
            return
        try:
            self.server.store.put(job, rank, step, data, job_limit=limit, keep_from=keep_from)
        except ReplicaUnavailable as exc:
            self._answer(507, reason=str(exc))
            return
        self._answer(200, reason="held")

    def do_GET(self) -> None:
        route = self._route()
        if route is None:
            return
        job, rank, step, _, _ = route
        data = None if rank is None or step is None else self.server.store.get(job, rank, step)
        if data is None:
            self._answer(404, reason="not held here")
            return
        self._answer(200, data)

    def do_DELETE(self) -> None:
        route = self._route()
        if route is None:
            return
        self.server.store.drop_job(route[0])
        self._answer(200, reason="dropped")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    store: ReplicaStore


_server: _Server | None = None
_server_lock = threading.Lock()


def serve() -> tuple[ReplicaStore, str]:
    """This process's store and the ``host:port`` its server listens on (started once)."""
    global _server
    with _server_lock:
        if _server is None:
            host, _, port = settings.REPLICA_ADDRESS.rpartition(":")
            server = _Server((host or "127.0.0.1", int(port or 0)), _Handler)
            server.store = ReplicaStore(settings.REPLICAS_KEPT)
            threading.Thread(target=server.serve_forever, name="replica-server", daemon=True).start()
            _server = server
        bound = _server.server_address
        return _server.store, f"{bound[0]!s}:{bound[1]}"


def _request(address: str, method: str, path: str, body: bytes | None = None) -> bytes:
    host, _, port = address.rpartition(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT_S)
    try:
        conn.request(method, path, body=body, headers={"X-Replica-Signature": signed(method, path)})
        response = conn.getresponse()
        data = response.read()
    except (OSError, http.client.HTTPException) as exc:
        raise ReplicaUnavailable(f"{address} did not answer: {exc}") from None
    finally:
        conn.close()
    if response.status != 200:
        raise ReplicaUnavailable(f"{address} answered {response.status}: {data[:200].decode(errors='replace')}")
    return data


def push(address: str, job: int, rank: int, step: int, data: bytes, *, limit: int, keep_from: int) -> None:
    """Send a replica; ``limit``: the most bytes the job may hold on that node (its memory
    limit); the holder drops the rank's steps before ``keep_from``."""
    _request(address, "PUT", f"/replicas/{job}/{rank}/{step}?limit={limit}&keep_from={keep_from}", data)


def fetch(address: str, job: int, rank: int, step: int) -> bytes:
    return _request(address, "GET", f"/replicas/{job}/{rank}/{step}")


def drop(address: str, job: int) -> None:
    _request(address, "DELETE", f"/replicas/{job}")


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
