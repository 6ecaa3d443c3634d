"""Scale-out (PostgreSQL, Redis as the channel layer, two Daphnes, a Celery control worker, node
agents as processes): every status change reaches open pages on either Daphne, whichever process
made it. Here: the job's creation (Daphne A's API), Running and the failover (the node agents'
processes), Stopping (``manage.py job stop`` in a terminal), Stopped (the agent again)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading

import pytest

from harness.processes import PY, ROOT

pytestmark = [pytest.mark.scaleout, pytest.mark.slow]

SLEEPER = "python -c \"import time\nprint('started', flush=True)\nwhile True: time.sleep(0.2)\""


class StatusSocket(threading.Thread):
    """A page's live socket on one Daphne (the list, or ``?job=<id>``), collecting what it gets."""

    def __init__(self, port: int, token: str, query: str = "") -> None:
        super().__init__(daemon=True)
        self.url = f"ws://127.0.0.1:{port}/ws/training-jobs/{query}"
        self.token = token
        self.messages: list[dict] = []
        self.ready = threading.Event()
        self.connections = 0
        self.stop_reading = False

    def run(self) -> None:
        asyncio.run(self.read())

    async def read(self) -> None:
        import websockets

        async with websockets.connect(self.url, additional_headers={"Authorization": f"Token {self.token}"}) as ws:
            self.connections += 1
            while not self.stop_reading:
                try:
                    message = json.loads(await asyncio.wait_for(ws.recv(), 0.5))
                except TimeoutError:
                    continue
                if message["type"] == "ready":
                    self.ready.set()
                else:
                    self.messages.append(message)

    def changes(self, job_id: int) -> list[tuple[str, str]]:
        """(from, status at delivery) of each status message about the job."""
        return [(m["from"], m["job"]["status"]) for m in list(self.messages) if m["type"] == "job" and m["job"]["id"] == job_id]


def is_subsequence(wanted: list, seen: list) -> bool:
    remaining = iter(seen)
    return all(any(item == got for got in remaining) for item in wanted)


def test_every_status_change_from_any_process_reaches_open_pages_on_both_daphnes(scaleout_cluster):
    first, second = scaleout_cluster.ports
    status, body = scaleout_cluster.api(first, "POST", "/api/v1/auth/token/", body={"username": "admin", "password": "admin-pass-1"})
    assert status == 200, body
    token = body["token"]
    scaleout_cluster.wait(
        lambda: len([n for n in scaleout_cluster.api(first, "GET", "/api/v1/nodes/", token)[1]["results"] if n["state"] == "Ready"]) == 3, "3 ready nodes"
    )

    listing = StatusSocket(second, token)
    listing.start()
    assert listing.ready.wait(30)
    status, job = scaleout_cluster.api(first, "POST", "/api/v1/training-jobs/", token, {"name": "live-status", "command": SLEEPER, "gpus_per_node": 1})
    assert status == 201, job
    job_id = job["id"]
    page = StatusSocket(first, token, f"?job={job_id}")
    page.start()
    assert page.ready.wait(30)

    def attempt(n: int):
        rows = scaleout_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/attempts/", token)[1]
        found = [a for a in rows if a["number"] == n and a["state"] == "running"]
        return found[0] if found else None

    one = scaleout_cluster.wait(lambda: attempt(1), "attempt 1 running")
    assert (
        scaleout_cluster.api(
            first, "POST", f"/api/v1/nodes/{one['nodes'][0]}/inject-fault/", token, {"gpu": one["placements"][0]["gpu_indices"][0], "xid": 79}
        )[0]
        == 201
    )
    scaleout_cluster.wait(lambda: attempt(2), "attempt 2 running after the fault")
    scaleout_cluster.wait(lambda: any(f == "Pending - failoverinprogress" for f, _ in page.changes(job_id)), "the failover on the page")

    stop = subprocess.run(
        [PY, "manage.py", "job", "stop", str(job_id)], check=False, cwd=ROOT, env=scaleout_cluster.env, capture_output=True, text=True, timeout=120
    )
    assert stop.returncode == 0, stop.stderr
    assert stop.stdout.strip() == f"Job {job_id} (live-status) is Stopping."
    for socket in (listing, page):
        scaleout_cluster.wait(lambda s=socket: any(f == "Stopping" and st == "Stopped" for f, st in s.changes(job_id)), "Stopped on the socket")

    history = scaleout_cluster.api(first, "GET", f"/api/v1/training-jobs/{job_id}/events/", token)[1]
    changes = [(e["from_status"], e["to_status"]) for e in history if e["from_status"] != e["to_status"]]
    assert changes == [
        ("", "Pending"),
        ("Pending", "Running"),
        ("Running", "Pending - failoverinprogress"),
        ("Pending - failoverinprogress", "Running"),
        ("Running", "Stopping"),
        ("Stopping", "Stopped"),
    ]
    for socket in (listing, page):
        socket.stop_reading = True
        socket.join(timeout=10)
        assert socket.connections == 1, "the socket reconnected"
    # Each change reached the list (open before the job existed) in order, and the job's page
    # every change from the failover on (it may have opened after the job started running).
    froms = [f for f, _ in changes]
    assert is_subsequence(froms, [f for f, _ in listing.changes(job_id)]), listing.changes(job_id)
    assert is_subsequence(froms[2:], [f for f, _ in page.changes(job_id)]), page.changes(job_id)
