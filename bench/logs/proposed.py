"""PROPOSED FIXES, not product code: measured with ``--proposed`` so the report can show what
they would buy. Two changes:

1. ``ingest_lines`` without the ORM's per-row cost: the same two MAX queries (both served by the
   unique indexes), then one ``executemany`` INSERT of plain tuples; the publish payload is built
   from the RawLines. Same semantics (dedupe by line_no per attempt, seq continues, publish after
   commit); returns the stored lines' payloads instead of LogLine instances.
2. The log socket (a) sends a live batch at once when the previous send is ≥ BATCH_INTERVAL ago
   and only delays the ones that come sooner (still at most 10 messages a second), instead of
   always waiting BATCH_INTERVAL after the first pending line; (b) splits every ``lines`` message
   (live and backlog) so that none exceeds MAX_MESSAGE_CHARS: Daphne refuses messages over 1 MiB
   (``websocket_max_message_size``), which today kills the flush task (lines silently lost) or the
   consumer (socket closed 1011, e.g. ``?tail=10000`` of 100-character lines).
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

MAX_MESSAGE_CHARS = 512 * 1024  # well under Daphne's 1 MiB; json.dumps output is ASCII


def ingest_lines(*, job_id: int, stream: str, attempt: int, lines: Sequence) -> list[dict]:
    from django.db import connection, transaction

    from jobs.realtime import log_group, publish
    from logs.models import LogLine

    if not lines:
        return []
    table = connection.ops.quote_name(LogLine._meta.db_table)
    with transaction.atomic():
        with connection.cursor() as cur:
            cur.execute(f"SELECT MAX(line_no) FROM {table} WHERE job_id = %s AND stream = %s AND attempt = %s", [job_id, stream, attempt])
            last_line_no = cur.fetchone()[0]
            fresh = sorted(lines, key=lambda ln: ln.line_no)
            if last_line_no is not None:
                fresh = [ln for ln in fresh if ln.line_no > last_line_no]
            if not fresh:
                return []
            cur.execute(f"SELECT MAX(seq) FROM {table} WHERE job_id = %s AND stream = %s", [job_id, stream])
            last_seq = cur.fetchone()[0] or 0
            adapt = connection.ops.adapt_datetimefield_value
            cur.executemany(
                f"INSERT INTO {table} (job_id, stream, attempt, seq, line_no, ts, text) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [(job_id, stream, attempt, last_seq + i, ln.line_no, adapt(ln.ts), ln.text) for i, ln in enumerate(fresh, start=1)],
            )
        payload_lines = [
            {"seq": last_seq + i, "attempt": attempt, "ts": ln.ts.isoformat(), "text": ln.text} for i, ln in enumerate(fresh, start=1)
        ]
        payload = {"type": "log.lines", "lines": payload_lines}
        transaction.on_commit(lambda: publish(log_group(job_id, stream), payload))
        try:  # the progress/metrics step of logs.services.ingest_lines, where the tree has it
            from logs.progress import publish_progress, record_metrics
        except ImportError:
            record_metrics = None
        if record_metrics is not None:
            progress = record_metrics(job_id=job_id, stream=stream, attempt=attempt, lines=[(ln.ts, ln.text) for ln in fresh])
            if progress is not None:
                transaction.on_commit(lambda: publish_progress(job_id, progress))
    return payload_lines


def patch_consumer() -> None:
    """Leading-edge batching in JobLogConsumer (see the module docstring)."""
    from logs import consumers

    C = consumers.JobLogConsumer

    async def log_lines(self, event):
        fresh = [line for line in event["lines"] if line["seq"] > self.last_seq]
        if not fresh or self.ended:
            return
        self.pending.extend(fresh)
        self.last_seq = fresh[-1]["seq"]
        if self.flusher is None or self.flusher.done():
            loop = asyncio.get_running_loop()
            wait = getattr(self, "last_sent", -1e9) + consumers.BATCH_INTERVAL - loop.time()
            if wait <= 0:
                await self.flush()
            else:
                self.flusher = asyncio.ensure_future(self.flush_later(wait))

    async def flush_later(self, wait=consumers.BATCH_INTERVAL):
        await asyncio.sleep(wait)
        await self.flush()

    async def flush(self):
        if self.pending:
            lines, self.pending = self.pending, []
            self.last_sent = asyncio.get_running_loop().time()
            await self.send_lines(lines, backlog=False)

    async def send_lines(self, lines, *, backlog):
        if lines:
            self.last_seq = max(self.last_seq, lines[-1]["seq"])
        head = '{"type": "lines", "backlog": %s, "lines": [' % ("true" if backlog else "false")
        parts: list[str] = []
        size = 0
        for line in lines:
            encoded = json.dumps(line)
            if parts and size + len(encoded) > MAX_MESSAGE_CHARS:
                await self.send(text_data=head + ",".join(parts) + "]}")
                parts, size = [], 0
            parts.append(encoded)
            size += len(encoded) + 1
        if parts or not lines:
            await self.send(text_data=head + ",".join(parts) + "]}")

    C.log_lines, C.flush_later, C.flush, C.send_lines = log_lines, flush_later, flush, send_lines


def patch_ingest() -> None:
    import jobs.agent.local
    import logs.services

    logs.services.ingest_lines = ingest_lines
    jobs.agent.local.ingest_lines = ingest_lines
