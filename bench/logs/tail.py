"""3. Serving the tail of a long log: ``tail_lines``, the REST tail page and the WebSocket backlog,
on a 1,000,000-line stream against a 1,000-line one."""

from __future__ import annotations

import asyncio
import json
import time

from bench.logs import wsclient


def fill_log(job_id: int, count: int) -> float:
    """``count`` lines for the job's master stream in one INSERT … SELECT (seconds taken)."""
    from django.db import connection, transaction

    from logs.models import LogLine

    table = LogLine._meta.db_table
    base = int(time.time()) - 86400
    sql = f"""
        WITH RECURSIVE x(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM x WHERE n < %s)
        INSERT INTO {table} (job_id, stream, attempt, seq, line_no, ts, text)
        SELECT %s, 'master', 1, n, n,
               strftime('%%Y-%%m-%%d %%H:%%M:%%S', %s + n / 1000, 'unixepoch') || printf('.%%06d', (n %% 1000) * 1000),
               printf('[2025-06-01 12:00:00,000] INFO train.py:412 step %%d | loss %%.4f | lr 3.00e-04 | tok/s %%d | grad_norm %%.3f',
                      n, (n %% 997) / 331.0, 40000 + (n * 7919) %% 20000, (n %% 113) / 113.0)
        FROM x
    """
    start = time.perf_counter()
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(sql, [count, job_id, base])
    return time.perf_counter() - start


def time_calls(fn, tries: int, warmup: int = 1) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(tries):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def tail_in_process(job_id: int, tries: int) -> list[float]:
    from logs.queries import tail_lines

    def call():
        lines = tail_lines(job_id, "master", 1000)
        assert len(lines) == min(1000, len(lines)) and lines, "no tail"

    return time_calls(call, tries)


def rest_test_client(job_id: int, token: str, tries: int) -> list[float]:
    from django.test import Client

    client = Client()
    url = f"/api/v1/training-jobs/{job_id}/logs/?before={2**63 - 1}&limit=1000"

    def call():
        resp = client.get(url, HTTP_AUTHORIZATION=f"Token {token}", HTTP_ACCEPT="application/json")
        assert resp.status_code == 200, resp.content[:300]
        body = json.loads(resp.content)
        assert len(body["lines"]) == 1000 or not body["has_more"]

    return time_calls(call, tries)


def rest_live(console, job_id: int, tries: int) -> list[float]:
    path = f"/api/v1/training-jobs/{job_id}/logs/?before={2**63 - 1}&limit=1000"

    def call():
        body = json.loads(console.get_raw(path))
        assert body["lines"]

    return time_calls(call, tries)


async def _ws_backlog(port: int, token: str, job_id: int) -> float:
    t = time.perf_counter()
    ws = await wsclient.connect("127.0.0.1", port, f"/ws/training-jobs/{job_id}/logs/?stream=master", {"Authorization": f"Token {token}"})
    try:
        while True:
            _, text = await ws.recv()
            msg = json.loads(text)
            if msg.get("type") == "lines" and msg.get("backlog"):
                dt = time.perf_counter() - t
                assert msg["lines"], "empty backlog"
                return dt
    finally:
        await ws.close()


def ws_backlog(console, job_id: int, tries: int) -> list[float]:
    async def run():
        await _ws_backlog(console.port, console.token, job_id)
        out = []
        for _ in range(tries):
            out.append(await _ws_backlog(console.port, console.token, job_id))
        return out

    return asyncio.run(run())


def prepare(big: int, small: int, log=print) -> dict[str, int]:
    from bench.logs.harness import finished_job

    jobs = {}
    for label, count in (("small", small), ("big", big)):
        job = finished_job(f"tail-{count}")
        dt = fill_log(job.pk, count)
        log(f"  inserted {count:,} lines for job {job.pk} in {dt:.1f} s")
        jobs[label] = job.pk
    return jobs
