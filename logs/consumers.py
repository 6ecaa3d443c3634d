"""The log tab's WebSocket: ``/ws/training-jobs/<id>/logs/?stream=master&after=<seq>``.

Messages to the client (JSON):
* ``{"type": "attempts", "banners": {"2": "attempt 2 on node-b … after a GPU fault …"}}``
* ``{"type": "lines", "lines": [{"seq", "attempt", "ts", "text"}, …], "backlog": bool}``
* ``{"type": "inserted", "from_seq": 473}``: lines an ended attempt delivered late (its node's
  agent back after the node was taken as lost) were stored in that attempt's place, at this seq,
  and the lines from it on moved up: the client drops the lines it holds from that seq on, and
  the ``lines`` that follow bring the stream from there again.
* ``{"type": "end", "status": "Completed"}`` once the job has finished, then the socket closes.
Without ``after`` the backlog is the stream's last ``tail`` lines (default 1000); with it, every
line after that ``seq``. Live lines are sent in batches, at most 10 messages a second, each line
once and in seq order: where a live message was lost on its way (a channel layer drops messages
to a full channel) the seqs show a gap, and the lines are read from the database instead. ``end``
comes only once the job is terminal and every stored line has been sent.
Close codes: 4400 bad parameters, 4401 not authenticated, 4404 no such job (or not yours), 4403
access revoked (asked again every ``SOCKET_ACCESS_RECHECK`` seconds).
"""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from jobs.models import TrainingJob
from jobs.realtime import job_group, log_group
from jobs.sockets import AccessRechecks
from jobs.statuses import TERMINAL
from logs.queries import attempt_banners, is_stream_name, lines_after, tail_lines

BATCH_INTERVAL = 0.1  # seconds between live messages to one client
BACKLOG_PAGE = 2000
MAX_TAIL = 10000
# Daphne refuses WebSocket messages over 1 MiB: larger batches go out as several messages.
MAX_MESSAGE_BYTES = 512 * 1024


class BadParameters(ValueError):
    pass


def parse_params(query_string: bytes) -> tuple[str, int | None, int]:
    try:
        params = parse_qs(query_string.decode("utf-8"), strict_parsing=False)
    except UnicodeDecodeError:
        raise BadParameters("the query string is not valid UTF-8") from None
    stream = params.get("stream", ["master"])[-1]
    if not is_stream_name(stream):
        raise BadParameters("stream must be master or worker-<n>")
    after = None
    if "after" in params:
        raw = params["after"][-1]
        if not raw.isdigit() or len(raw) > 18:
            raise BadParameters("after must be a non-negative integer seq")
        after = int(raw)
    tail = 1000
    if "tail" in params:
        raw = params["tail"][-1]
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_TAIL:
            raise BadParameters(f"tail must be an integer from 1 to {MAX_TAIL}")
        tail = int(raw)
    return stream, after, tail


class JobLogConsumer(AccessRechecks, AsyncJsonWebsocketConsumer):
    async def connect(self):
        self.groups_joined: list[str] = []
        self.pending: list[dict] = []
        self.flusher: asyncio.Task | None = None
        self.last_seq = 0  # the newest seq sent or waiting in ``pending``
        self.sent_seq = 0  # the newest seq sent
        self.gap = False  # a live message was lost: the next flush reads from the database
        self.sending = asyncio.Lock()  # one sender at a time (the flusher task, the end), so lines go out in order
        self.last_sent = 0.0
        self.ended = False
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401, reason="authentication required")
            return
        try:
            self.job_id = int(self.scope["url_route"]["kwargs"]["job_id"])
            self.stream, after, tail = parse_params(self.scope.get("query_string", b""))
        except (BadParameters, ValueError) as exc:
            await self.close(code=4400, reason=str(exc)[:120])
            return
        status = await self.read_status(user)
        if status is None:
            await self.close(code=4404, reason="no such training job")
            return
        self.start_access_rechecks()
        # Join before reading the backlog: a line committed in between arrives twice at most,
        # and the seq check drops the second copy.
        for group in (log_group(self.job_id, self.stream), job_group(self.job_id)):
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.send_json({"type": "attempts", "banners": await self.banners()})
        if after is None:
            lines = await self.tail(tail)
            await self.send_lines(lines, backlog=True)
        else:
            self.last_seq = self.sent_seq = after
            await self.send_stored(backlog=True)
        status = await self.read_status(user)
        if status in TERMINAL:
            await self.finish(status)

    async def disconnect(self, code):
        await self.stop_access_rechecks()
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        # connect() may have refused the socket before it set the flusher up
        flusher: asyncio.Task | None = getattr(self, "flusher", None)
        if flusher is not None:
            flusher.cancel()

    async def still_allowed(self, user) -> bool:
        return await self.read_status(user) is not None

    async def receive_json(self, content, **kwargs):
        # The socket is one-way; a client message is answered with an error, never a crash.
        await self.send_json({"type": "error", "detail": "this socket only sends; reconnect with ?after=<seq> to resume"})

    async def decode_json(self, text_data):
        try:
            return await super().decode_json(text_data)
        except ValueError:
            return None

    # --- group messages ----------------------------------------------------------------------
    async def log_lines(self, event):
        fresh = [line for line in event["lines"] if line["seq"] > self.last_seq]
        if not fresh or self.ended:
            return
        if fresh[0]["seq"] != self.last_seq + 1:
            self.gap = True
        self.pending.extend(fresh)
        self.last_seq = fresh[-1]["seq"]
        if self.flusher is None or self.flusher.done():
            # Send at once when the last message went out long enough ago; otherwise wait, so a
            # client gets at most 1 / BATCH_INTERVAL messages a second.
            wait = self.last_sent + BATCH_INTERVAL - asyncio.get_running_loop().time()
            self.flusher = asyncio.ensure_future(self.flush_later(max(wait, 0.0)))

    async def log_inserted(self, event):
        """Late lines of an ended attempt went in at ``from_seq``: what was sent from there on has
        moved, so say so and send the stream again from there (the database has it)."""
        from_seq = event["from_seq"]
        if self.ended:
            return
        async with self.sending:
            if self.ended:
                return
            self.pending = []
            self.gap = False
            if from_seq <= self.sent_seq:
                await self.send_json({"type": "inserted", "from_seq": from_seq})
                self.sent_seq = from_seq - 1
            self.last_seq = self.sent_seq
            await self.send_stored(backlog=False)

    async def job_status(self, event):
        if event.get("status") == "Running" and event.get("from") != "Pending":
            await self.send_json({"type": "attempts", "banners": await self.banners()})
        if event.get("status") in TERMINAL:
            await self.finish(event["status"])

    # --- helpers -----------------------------------------------------------------------------
    async def flush_later(self, delay: float):
        if delay:
            await asyncio.sleep(delay)
        await self.flush()

    async def flush(self):
        async with self.sending:
            await self.send_pending()

    async def send_pending(self):
        if self.gap:
            # Lines between the last sent and the newest seen never came: the database has them.
            self.gap = False
            self.pending = []
            await self.send_stored(backlog=False)
        elif self.pending:
            lines, self.pending = self.pending, []
            await self.send_lines(lines, backlog=False)

    async def send_stored(self, *, backlog: bool):
        """Send every stored line after the last one sent, a page at a time."""
        while True:
            lines = await self.after(self.sent_seq)
            await self.send_lines(lines, backlog=backlog, always=backlog)
            if len(lines) < BACKLOG_PAGE:
                return

    async def send_lines(self, lines: list[dict], *, backlog: bool, always: bool = True):
        """Send the lines not sent yet as one message, or several where one would pass the size
        limit; with ``always`` a message goes out even when there is nothing to send."""
        lines = [line for line in lines if line["seq"] > self.sent_seq]
        if not lines and not always:
            return
        if lines:
            self.sent_seq = lines[-1]["seq"]
            self.last_seq = max(self.last_seq, self.sent_seq)
        chunk: list[dict] = []
        size = 0
        for line in lines:
            line_size = len(line["text"].encode("utf-8")) + 96  # the text and its JSON frame
            if chunk and size + line_size > MAX_MESSAGE_BYTES:
                await self.send_json({"type": "lines", "lines": chunk, "backlog": backlog})
                chunk, size = [], 0
            chunk.append(line)
            size += line_size
        if chunk or not lines:
            await self.send_json({"type": "lines", "lines": chunk, "backlog": backlog})
        self.last_sent = asyncio.get_running_loop().time()

    async def finish(self, status: str):
        if self.ended:
            return
        # The job's lines are all stored before it turns terminal (the agent reports an exit only
        # once the run's output is ingested), but some may still be on their way here: send every
        # stored line after the last one sent, then say the end.
        async with self.sending:
            if self.ended:
                return
            self.pending = []
            self.gap = False
            await self.send_stored(backlog=False)
            self.ended = True
            await self.send_json({"type": "end", "status": status})
            await self.close(code=1000)

    @database_sync_to_async
    def read_status(self, user) -> str | None:

        return TrainingJob.objects.visible_to(user).filter(pk=self.job_id).values_list("status", flat=True).first()

    @database_sync_to_async
    def banners(self) -> dict[str, str]:
        return {str(k): v for k, v in attempt_banners(self.job_id).items()}

    @database_sync_to_async
    def tail(self, count: int) -> list[dict]:
        return tail_lines(self.job_id, self.stream, count)

    @database_sync_to_async
    def after(self, seq: int) -> list[dict]:
        return lines_after(self.job_id, self.stream, seq, BACKLOG_PAGE)
