"""Scale-out on real parts: PostgreSQL, Redis, two Daphne processes, a Celery control worker with
beat and three node agents as separate processes on loopback."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import Counter
from pathlib import Path

import psutil
import pytest

from agent import runfiles

pytestmark = [pytest.mark.scaleout, pytest.mark.slow]

# Prints its attempt's numbered lines steadily until stopped.
COUNTER = (
    'python -c "import os, time\n'
    "print('Starting dataset initialization', flush=True)\n"
    "i = 0\n"
    "while True:\n"
    "    print('attempt', os.environ['JOB_ATTEMPT'], 'line', i, flush=True); i += 1; time.sleep(0.02)\""
)


class SocketReader(threading.Thread):
    """A WebSocket client on the other Daphne process, collecting every line it is sent."""

    def __init__(self, port: int, job_id: int, token: str) -> None:
        super().__init__(daemon=True)
        self.url = f"ws://127.0.0.1:{port}/ws/training-jobs/{job_id}/logs/?stream=master&after=0"
        self.token = token
        self.lines: list[dict] = []
        self.inserted: list[int] = []  # from_seq of each "inserted" message
        self.banners: dict[str, str] = {}  # the latest "attempts" message's banners, by attempt
        self.end: dict | None = None

    def run(self) -> None:
        asyncio.run(self.read())

    async def read(self) -> None:
        import websockets

        async with websockets.connect(self.url, additional_headers={"Authorization": f"Token {self.token}"}) as ws:
            async for raw in ws:
                message = json.loads(raw)
                if message["type"] == "lines":
                    self.lines.extend(message["lines"])
                elif message["type"] == "attempts":
                    self.banners = message["banners"]
                elif message["type"] == "inserted":
                    # Late lines of an ended attempt went in its place: drop what we hold from
                    # there on, as the viewer does; the stream is sent again from that seq.
                    self.inserted.append(message["from_seq"])
                    self.lines = [ln for ln in self.lines if ln["seq"] < message["from_seq"]]
                elif message["type"] == "end":
                    self.end = message
                    return


def test_a_job_fails_over_across_agent_processes_and_its_log_reaches_the_other_daphne(scaleout_cluster):
    first, second = scaleout_cluster.ports
    status, body = scaleout_cluster.api(first, "POST", "/api/v1/auth/token/", body={"username": "admin", "password": "admin-pass-1"})
    assert status == 200, body
    token = body["token"]
    scaleout_cluster.wait(
        lambda: len([n for n in scaleout_cluster.api(first, "GET", "/api/v1/nodes/", token)[1]["results"] if n["state"] == "Ready"]) == 3, "3 ready nodes"
    )

    status, job = scaleout_cluster.api(first, "POST", "/api/v1/training-jobs/", token, {"name": "scale", "command": COUNTER, "gpus_per_node": 1})
    assert status == 201, job
    job_id = job["id"]
    reader = SocketReader(second, job_id, token)
    reader.start()

    def attempt(n: int):
        rows = scaleout_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/attempts/", token)[1]
        found = [a for a in rows if a["number"] == n and a["state"] == "running"]
        return found[0] if found else None

    one = scaleout_cluster.wait(lambda: attempt(1), "attempt 1 running")
    scaleout_cluster.wait(lambda: any("line 20" in ln["text"] for ln in reader.lines), "lines on the other Daphne")

    # A hardware fault on its node: the job moves to another node.
    node_one = one["nodes"][0]
    gpu = one["placements"][0]["gpu_indices"][0]
    assert scaleout_cluster.api(first, "POST", f"/api/v1/nodes/{node_one}/inject-fault/", token, {"gpu": gpu, "xid": 79})[0] == 201
    two = scaleout_cluster.wait(lambda: attempt(2), "attempt 2 running after the fault")
    assert two["nodes"][0] != node_one
    scaleout_cluster.wait(lambda: any(ln["attempt"] == 2 and "line 20" in ln["text"] for ln in reader.lines), "attempt 2 lines")

    # Its agent dies (SIGKILL): the heartbeat sweeper takes the node as lost and fails the job over.
    node_two = two["nodes"][0]
    scaleout_cluster.kill(f"agent-{node_two}")
    three = scaleout_cluster.wait(lambda: attempt(3), "attempt 3 after the agent was killed", timeout=60)
    assert three["nodes"][0] not in (node_one, node_two)
    scaleout_cluster.wait(lambda: any(ln["attempt"] == 3 and "line 20" in ln["text"] for ln in reader.lines), "attempt 3 lines")
    # Meanwhile attempt 2's run goes on with no agent (nothing on the control host signals it):
    # the job's fence names attempt 3, so ckptlib in that stray run commits nothing
    # (docs/failover.md, "A lost node's run").
    fence = Path(scaleout_cluster.env["JOB_WORK_ROOT"]) / str(job_id) / "fence" / "attempt"
    assert fence.read_text().split()[0] == "3"
    stray = runfiles.read_pid(Path(scaleout_cluster.env["JOB_WORK_ROOT"]) / str(job_id) / "attempt-2" / "rank-0")
    assert stray is not None and stray.pgid is not None
    assert running(stray.pgid), "the stray run was ended before its agent came back"
    # The agent comes back: it ends the stray run and delivers the lines it wrote meanwhile.
    scaleout_cluster.start_agent(node_two)
    scaleout_cluster.wait(lambda: not running(stray.pgid), "the stray run ended by its own agent", timeout=60)

    assert scaleout_cluster.api(first, "POST", f"/api/v1/training-jobs/{job_id}/stop/", token)[0] == 200
    scaleout_cluster.wait(lambda: scaleout_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/", token)[1]["status"] == "Stopped", "Stopped")
    reader.join(timeout=30)
    assert reader.end == {"type": "end", "status": "Stopped"}

    history = scaleout_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/events/", token)[1]
    events = [e["to_status"] for e in history if e["from_status"] != e["to_status"]]
    assert events == ["Pending", "Running", "Pending - failoverinprogress", "Running", "Pending - failoverinprogress", "Running", "Stopping", "Stopped"]

    # No line lost or duplicated: the database holds exactly what each run printed, once, and
    # the socket on the other Daphne got every line up to the end.
    def stored() -> list[dict]:
        lines, after = [], 0
        while True:
            page = scaleout_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/logs/?after={after}&limit=5000", token)[1]
            lines.extend(page["lines"])
            if not page["has_more"]:
                return lines
            after = page["next_after"]

    def printed() -> dict[int, list[str]]:
        out = {}
        for n in (1, 2, 3):
            path = Path(scaleout_cluster.env["JOB_WORK_ROOT"]) / str(job_id) / f"attempt-{n}" / "rank-0" / runfiles.OUTPUT_FILE
            out[n] = [json.loads(line)["s"] for line in path.read_text().splitlines()]
        return out

    def complete() -> bool:
        by_attempt: dict[int, list[str]] = {}
        for line in stored():
            by_attempt.setdefault(line["attempt"], []).append(line["text"])
        return by_attempt == printed()

    scaleout_cluster.wait(complete, "every printed line stored exactly once", timeout=30)
    rows = stored()
    assert [ln["seq"] for ln in rows] == list(range(1, len(rows) + 1))
    assert [ln["text"] for ln in rows].count("Starting dataset initialization") == 3
    received = [ln["seq"] for ln in reader.lines]
    assert len(received) == len(set(received)), "a line reached the socket twice"
    assert received == sorted(received)
    # Lines of the lost node's run written after its agent died arrive later, when it returns: they
    # are stored in attempt 2's place, before attempt 3's lines (the log reads 1, 2, 3). Here they
    # come after the job ended and the socket said "end", so the socket lacks just those.
    assert [ln["attempt"] for ln in rows] == sorted(ln["attempt"] for ln in rows)
    missing = Counter((ln["attempt"], ln["text"]) for ln in rows) - Counter((ln["attempt"], ln["text"]) for ln in reader.lines)
    assert all(attempt == 2 for attempt, _ in missing), missing
    # The viewer's banners between the attempts: a GPU fault, then a lost node, said once.
    assert "GPU" in reader.banners["2"] and "lost" in reader.banners["3"] and reader.banners["3"].count("lost") == 1, reader.banners


def running(pgid: int) -> bool:
    """Whether any live (not zombie) process is left in the run's process group."""
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False
