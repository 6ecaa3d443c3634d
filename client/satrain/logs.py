"""Reading a job's log: pages over REST, or following over the log WebSocket.

Following resumes after a dropped connection from the last ``seq`` it printed
(``?after=<seq>``), so every line is shown exactly once, across reconnects and failovers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlencode, urlsplit, urlunsplit

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import connect

from satrain.api import JOBS, ApiError, Client, JsonObject

MAX_DB_INT = 2**63 - 1
PAGE = 5000
# The socket's close codes that retrying cannot fix.
FATAL_CLOSE = {4400: "bad parameters", 4401: "not authenticated", 4403: "access revoked", 4404: "no such job, or you may not see it"}


def read_lines(client: Client, job_id: int, *, stream: str, tail: int | None = None) -> Iterator[JsonObject]:
    """The stream's lines in seq order: all of them, or the last ``tail``."""
    path = f"{JOBS}{job_id}/logs/"
    if tail is not None:
        pages: list[list[JsonObject]] = []
        before, wanted = MAX_DB_INT, tail
        while wanted > 0:
            page = client.get(path, stream=stream, before=before, limit=min(wanted, PAGE))
            if not page["lines"]:
                break
            pages.append(page["lines"])
            wanted -= len(page["lines"])
            before = page["lines"][0]["seq"]
            if not page["has_more"]:
                break
        for page_lines in reversed(pages):
            yield from page_lines
        return
    after = 0
    while True:
        page = client.get(path, stream=stream, after=after, limit=PAGE)
        yield from page["lines"]
        if not page["has_more"] or not page["lines"]:
            return
        after = page["next_after"]


def socket_url(base: str, job_id: int, **params: object) -> str:
    parts = urlsplit(base)
    scheme = "wss" if parts.scheme == "https" else "ws"
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return urlunsplit((scheme, parts.netloc, f"{parts.path.rstrip('/')}/ws/training-jobs/{job_id}/logs/", query, ""))


def follow(
    client: Client,
    job_id: int,
    *,
    stream: str,
    on_line: Callable[[JsonObject], None],
    tail: int | None = None,
    on_banner: Callable[[str, str], None] | None = None,
    on_reconnect: Callable[[int, str], None] | None = None,
    on_inserted: Callable[[int], None] | None = None,
    max_wait: float = 30.0,
) -> str:
    """Follow the stream until the job ends; returns its final status.

    The first connection starts at the last ``tail`` lines (every line when None); after a drop
    the next one asks for the lines after the last seq seen, with backoff up to ``max_wait``.
    Where lines an ended attempt delivered late (its node came back) went in before lines already
    printed, ``on_inserted(from_seq)`` is told and the stream is printed again from that seq.
    """
    last_seq: int | None = None
    banners_seen: set[str] = set()
    delay = 0.5
    while True:
        params: dict[str, object] = {"stream": stream}
        if last_seq is not None:
            params["after"] = last_seq
        elif tail is not None:
            params["tail"] = tail
        else:
            params["after"] = 0
        headers = {"Authorization": f"Token {client.settings.token}"} if client.settings.token else {}
        reason = ""
        try:
            with connect(socket_url(client.settings.url, job_id, **params), additional_headers=headers, open_timeout=15, max_size=4 * 1024 * 1024) as ws:
                for raw in ws:
                    message = json.loads(raw)
                    kind = message.get("type")
                    if kind == "lines":
                        delay = 0.5
                        for line in message["lines"]:
                            if last_seq is None or line["seq"] > last_seq:
                                last_seq = line["seq"]
                                on_line(line)
                        if last_seq is None:
                            last_seq = 0
                    elif kind == "inserted":
                        from_seq = int(message["from_seq"])
                        if last_seq is not None and from_seq <= last_seq:
                            if on_inserted is not None:
                                on_inserted(from_seq)
                            last_seq = from_seq - 1
                    elif kind == "attempts" and on_banner is not None:
                        for attempt, text in sorted(message.get("banners", {}).items(), key=lambda kv: int(kv[0])):
                            if attempt not in banners_seen:
                                banners_seen.add(attempt)
                                on_banner(attempt, text)
                    elif kind == "end":
                        final_status: str = message["status"]
                        return final_status
            reason = "the console closed the connection"
        except ConnectionClosed as exc:
            close = exc.rcvd
            code = close.code if close is not None else None
            if close is not None and close.code in FATAL_CLOSE:
                raise ApiError(close.code, f"log socket closed: {FATAL_CLOSE[close.code]} ({close.reason})") from None
            reason = f"connection lost ({code or 'no close frame'})"
        except InvalidStatus as exc:
            status = exc.response.status_code
            if status in (401, 403, 404):
                raise ApiError(status, f"the log socket refused the connection (HTTP {status})") from None
            reason = f"HTTP {status}"
        except (OSError, InvalidHandshake, TimeoutError) as exc:
            reason = f"cannot connect: {exc}"
        if on_reconnect is not None:
            on_reconnect(last_seq or 0, reason)
        time.sleep(delay)
        delay = min(delay * 2, max_wait)
