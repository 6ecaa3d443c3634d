"""1. Ingest throughput: ``ingest_lines`` (dedupe, seq, bulk insert, publish after commit) in the
agent's batch sizes, the agent's whole ``NodeAgent.drain`` (output.jsonl → ingest), and a raw
``LogLine.objects.bulk_create`` of the same rows as the baseline."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from agent import runfiles


def make_texts(n: int, seed: int = 7) -> list[str]:
    """Training-like lines of 80-120 characters."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        base = (
            f"[2025-06-01 12:{(i // 60000) % 60:02d}:{(i // 1000) % 60:02d},{i % 1000:03d}] INFO train.py:412 "
            f"step {i} | loss {rng.random() * 3:.4f} | lr 3.00e-04 | tok/s {rng.randint(40000, 60000)}"
        )
        want = rng.randint(80, 120)
        base += f" | grad_norm {rng.random():.6f} | mem 71.2GB | data shard-{i % 97:05d}"
        base = base[:want] if len(base) >= want else base + "." * (want - len(base))
        out.append(base[:want])
    return out


@dataclass
class IngestResult:
    name: str
    batch: int
    lines: int
    seconds: float
    batch_s: list[float] = field(default_factory=list)

    @property
    def rate(self) -> float:
        return self.lines / self.seconds if self.seconds else float("nan")


def raw_lines(texts: list[str], t0: float):
    from logs.services import RawLine

    return [RawLine(line_no=i + 1, ts=datetime.fromtimestamp(t0 + i * 0.001, tz=UTC), text=t) for i, t in enumerate(texts)]


def bench_ingest_lines(job_id: int, lines, batch: int) -> IngestResult:
    from logs.services import ingest_lines

    res = IngestResult("ingest_lines", batch, len(lines), 0.0)
    start = time.perf_counter()
    for i in range(0, len(lines), batch):
        t = time.perf_counter()
        ingest_lines(job_id=job_id, stream="master", attempt=1, lines=lines[i : i + batch])
        res.batch_s.append(time.perf_counter() - t)
    res.seconds = time.perf_counter() - start
    return res


def bench_bulk_create(job_id: int, lines, batch: int) -> IngestResult:
    """The same rows, with the seq computed in Python: no dedupe query, no publish."""
    from django.db import transaction

    from logs.models import LogLine

    res = IngestResult("raw bulk_create", batch, len(lines), 0.0)
    start = time.perf_counter()
    for i in range(0, len(lines), batch):
        t = time.perf_counter()
        with transaction.atomic():
            LogLine.objects.bulk_create(
                [LogLine(job_id=job_id, stream="master", attempt=1, seq=ln.line_no, line_no=ln.line_no, ts=ln.ts, text=ln.text) for ln in lines[i : i + batch]],
                batch_size=2000,
            )
        res.batch_s.append(time.perf_counter() - t)
    res.seconds = time.perf_counter() - start
    return res


def bench_drain(job_id: int, texts: list[str], t0: float, work: Path, chunk: int) -> IngestResult:
    """The agent's own path: output.jsonl as the runner writes it, read by ``NodeAgent.drain``
    ``chunk`` lines at a time (what one collect finds), parsed and ingested in INGEST_BATCH slices."""
    from agent.node_agent import NodeAgent
    from agent.output import INGEST_BATCH

    work.mkdir(parents=True, exist_ok=True)
    path = work / runfiles.OUTPUT_FILE
    encoded = [json.dumps({"n": i + 1, "t": t0 + i * 0.001, "s": t}, ensure_ascii=False).encode() + b"\n" for i, t in enumerate(texts)]
    agent = NodeAgent([], name="bench")
    part = SimpleNamespace(pk=10_000_000 + job_id, stream="master", ended_at=None, attempt=SimpleNamespace(job_id=job_id, number=1))
    res = IngestResult(f"NodeAgent.drain (≤{INGEST_BATCH}/ingest)", chunk, len(texts), 0.0)
    with open(path, "wb") as fh:
        for i in range(0, len(encoded), chunk):
            fh.write(b"".join(encoded[i : i + chunk]))
            fh.flush()
            t = time.perf_counter()
            while not agent.drain(part, work):  # a drain is one turn (OUTPUT_TURN_SECONDS): the next turns follow
                pass
            dt = time.perf_counter() - t
            res.batch_s.append(dt)
            res.seconds += dt
    return res


def run_ingest(*, total: int, batches: list[int], work_root: Path, log=print) -> list[IngestResult]:
    from django.db import connection

    from bench.logs.harness import finished_job
    from logs.models import LogLine

    texts = make_texts(total)
    avg = sum(map(len, texts)) / len(texts)
    log(f"  {total:,} lines per run, {avg:.0f} characters on average")
    t0 = time.time() - 3600
    lines = raw_lines(texts, t0)
    results: list[IngestResult] = []
    for batch in batches:
        jobs = {}
        for name, fn in (("ingest", bench_ingest_lines), ("bulk", bench_bulk_create)):
            job = jobs[name] = finished_job(f"ingest-{name}-{batch}")
            r = fn(job.pk, lines, batch)
            assert LogLine.objects.filter(job_id=job.pk).count() == total, "not every line was stored"
            results.append(r)
            log(f"  {r.name:<32} batch {batch:>5}: {r.rate:>10,.0f} lines/s  ({r.seconds:.2f} s)")
        # A redelivered batch: every line is a duplicate.
        from logs.services import ingest_lines

        t = time.perf_counter()
        ingest_lines(job_id=jobs["ingest"].pk, stream="master", attempt=1, lines=lines[:batch])
        log(f"  {'(redelivered batch, all dropped)':<32} batch {batch:>5}: {(time.perf_counter() - t) * 1000:.1f} ms")
    chunk = 1000
    job = finished_job("ingest-drain")
    r = bench_drain(job.pk, texts, t0, work_root / "drain", chunk)
    assert LogLine.objects.filter(job_id=job.pk).count() == total
    results.append(r)
    log(f"  {r.name:<32} chunk {chunk:>5}: {r.rate:>10,.0f} lines/s  ({r.seconds:.2f} s; parse + ingest)")
    connection.close()
    return results
