"""2. Print → WebSocket latency: real jobs (``bench/logs/printer.py``) run by the console's embedded
agent, viewers on ``/ws/training-jobs/<id>/logs/?stream=master&after=0`` with a token."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from bench.logs import wsclient
from bench.logs.harness import REPO

PRINTER = REPO / "bench" / "logs" / "printer.py"


@dataclass
class Viewer:
    job_id: int
    index: int
    latencies: list[float] = field(default_factory=list)  # seconds, live lines only
    seqs: list[int] = field(default_factory=list)
    counters: list[int] = field(default_factory=list)
    backlog_lines: int = 0
    live_lines: int = 0
    messages: int = 0
    end_status: str | None = None
    close_code: int | None = None
    error: str | None = None
    first_recv: float | None = None
    last_recv: float | None = None

    def check(self, expected: int) -> dict:
        """Seq continuity and the printer's counter: lost and duplicated lines."""
        seen = set()
        dup_seq = 0
        for s in self.seqs:
            if s in seen:
                dup_seq += 1
            seen.add(s)
        gaps = 0
        if seen:
            gaps = (max(seen) - min(seen) + 1) - len(seen) + (min(seen) - 1)
        counters = set(self.counters)
        dup_i = len(self.counters) - len(counters)
        lost_i = expected - len(counters & set(range(expected)))
        return {"dup_seq": dup_seq, "seq_gaps": gaps, "dup_i": dup_i, "lost_i": lost_i}


async def watch(viewer: Viewer, port: int, token: str, deadline: float) -> None:
    path = f"/ws/training-jobs/{viewer.job_id}/logs/?stream=master&after=0"
    try:
        ws = await wsclient.connect("127.0.0.1", port, path, {"Authorization": f"Token {token}"})
    except Exception as exc:  # reported per viewer
        viewer.error = f"connect: {exc}"
        return
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                viewer.error = "timed out before the end message"
                break
            try:
                now, text = await asyncio.wait_for(ws.recv(), remaining)
            except wsclient.WebSocketClosed as exc:
                viewer.close_code = exc.code
                break
            msg = json.loads(text)
            viewer.messages += 1
            kind = msg.get("type")
            if kind == "end":
                viewer.end_status = msg.get("status")
                continue
            if kind != "lines":
                continue
            viewer.first_recv = viewer.first_recv or now
            viewer.last_recv = now
            backlog = msg.get("backlog")
            for line in msg["lines"]:
                viewer.seqs.append(line["seq"])
                text_ = line["text"]
                if not text_.startswith("t="):
                    continue
                head = text_.split(" ", 2)
                printed = float(head[0][2:])
                viewer.counters.append(int(head[1][2:]))
                if backlog:
                    viewer.backlog_lines += 1
                else:
                    viewer.live_lines += 1
                    viewer.latencies.append(now - printed)
    except TimeoutError:
        viewer.error = "timed out before the end message"
    except Exception as exc:
        viewer.error = f"{type(exc).__name__}: {exc}"
    finally:
        await ws.close()


@dataclass
class LiveResult:
    jobs: int
    viewers_per_job: int
    rate: float
    seconds: float
    viewers: list[Viewer]
    job_status: dict[int, str]
    stored: dict[int, int]
    wall: float
    cpu: dict[str, float] = field(default_factory=dict)
    window: tuple[float, float] = (0.0, 0.0)  # time.time() of the run's start and end

    @property
    def expected(self) -> int:
        return int(self.rate * self.seconds)

    def all_latencies(self) -> list[float]:
        return [x for v in self.viewers for x in v.latencies]


def command(rate: float, seconds: float, delay: float) -> str:
    return f"python {PRINTER} --rate {rate:g} --seconds {seconds:g} --delay {delay:g} --width 100"


class CpuSampler:
    """CPU seconds by kind of process (console, runners, printers, this bench), sampled every
    0.5 s so that processes that end during the run still count."""

    def __init__(self, console_pid: int, var_dir) -> None:
        import os
        import threading

        self.console_pid = console_pid
        self.var_dir = str(var_dir)  # runs of this install only (other installs may share the machine)
        self.me = os.getpid()
        self.seen: dict[int, tuple[str, float, float]] = {}  # pid → (kind, first cpu, last cpu)
        self.stop = threading.Event()
        self.started = False
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def kind(self, proc) -> str | None:
        if proc.pid == self.console_pid:
            return "console (Daphne + agent)"
        if proc.pid == self.me:
            return "bench viewers (WS client)"
        try:
            cmd = " ".join(proc.cmdline())
            if "agent.runner" in cmd and self.var_dir in cmd:
                return "runners (agent.runner)"
            if "printer.py" in cmd and proc.cwd().startswith(self.var_dir):
                return "training processes (printer)"
        except Exception:
            return None
        return None

    def sample(self) -> None:
        import psutil

        for proc in psutil.process_iter():
            try:
                known = self.seen.get(proc.pid)
                kind = known[0] if known else self.kind(proc)
                if kind is None:
                    continue
                t = proc.cpu_times()
                cpu = t.user + t.system
            except Exception:  # gone meanwhile
                continue
            first = known[1] if known else (cpu if not self.started else 0.0)
            self.seen[proc.pid] = (kind, first, cpu)

    def loop(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(0.5)

    def start(self) -> None:
        self.sample()
        self.started = True
        self.thread.start()

    def finish(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        self.sample()
        out: dict[str, float] = {}
        for kind, first, last in self.seen.values():
            # Processes born during the run count from 0; those alive before from the first sample.
            out[kind] = out.get(kind, 0.0) + last - first
        return out


def run_live(console, *, jobs: int, viewers_per_job: int, rate: float, seconds: float, delay: float, tag: str, log=print) -> LiveResult:
    created = []
    sampler = CpuSampler(console.proc.pid, console.var_dir)
    sampler.start()
    t_begin = time.time()
    wall0 = time.monotonic()
    for j in range(jobs):
        body = {"name": f"{tag}-{j:02d}", "command": command(rate, seconds, delay), "gpus_per_node": 1}
        created.append(console.api("POST", "/api/v1/training-jobs/", body)["id"])
    viewers = [Viewer(job_id, k) for job_id in created for k in range(viewers_per_job)]
    deadline = time.monotonic() + delay + seconds + 90

    async def all_viewers():
        await asyncio.gather(*(watch(v, console.port, console.token, deadline) for v in viewers))

    asyncio.run(all_viewers())
    wall = time.monotonic() - wall0
    cpu = {f"CPU s {k}": v for k, v in sorted(sampler.finish().items())}
    status = {}
    stored = {}
    for job_id in created:
        detail = console.api("GET", f"/api/v1/training-jobs/{job_id}/")
        status[job_id] = detail.get("status") + (f" ({detail['status_reason']})" if detail.get("status_reason") else "")
        page = console.api("GET", f"/api/v1/training-jobs/{job_id}/logs/?before={2**63 - 1}&limit=1")
        stored[job_id] = page["lines"][-1]["seq"] if page["lines"] else 0
    res = LiveResult(jobs, viewers_per_job, rate, seconds, viewers, status, stored, wall, cpu, (t_begin, time.time()))
    return res


def flood_command(lines: int) -> str:
    """A job that prints ``lines`` lines of about 100 characters as fast as it can."""
    return (
        'python -c "import sys\n'
        "w = sys.stdout.write\n"
        f"for i in range({lines}): w('flood %d step %d | loss 1.2345 | lr 3.00e-04 | padding to about a hundred characters ....\\n' % (i, i // 10))\n"
        'sys.stdout.flush()"'
    )


def run_fairness(console, *, floods: int, flood_lines: int, rate: float, seconds: float, log=print) -> tuple[LiveResult, dict]:
    """The quiet job (``rate`` lines/s, one viewer) while ``floods`` jobs print ``flood_lines``
    lines each: its print → WebSocket latency, and how far the floods got."""
    flooding = []
    for j in range(floods):
        body = {"name": f"flood-{j:02d}", "command": flood_command(flood_lines), "gpus_per_node": 1}
        flooding.append(console.api("POST", "/api/v1/training-jobs/", body)["id"])
    # The quiet job starts printing 2 s after it is created: by then the floods are printing.
    quiet = run_live(console, jobs=1, viewers_per_job=1, rate=rate, seconds=seconds, delay=2.0, tag="fair-quiet", log=log)
    floods_state = {}
    for job_id in flooding:
        detail = console.api("GET", f"/api/v1/training-jobs/{job_id}/")
        page = console.api("GET", f"/api/v1/training-jobs/{job_id}/logs/?before={2**63 - 1}&limit=1")
        floods_state[job_id] = {"status": detail.get("status"), "stored_seq": page["lines"][-1]["seq"] if page["lines"] else 0}
        if detail.get("status") not in ("Completed", "Failed", "Stopped"):
            console.api("POST", f"/api/v1/training-jobs/{job_id}/stop/", {})
    return quiet, floods_state
