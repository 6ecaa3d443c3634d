"""`satrain jobs logs -f` when lines an ended attempt delivered late go in before lines it already
printed (logs/consumers.py's ``inserted`` message): it says so and prints the log again from there,
so the late lines are shown, in their place, and nothing after them is skipped."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from satrain.api import Client
from satrain.config import Settings
from satrain.logs import follow


def line(seq: int, attempt: int, text: str) -> dict:
    return {"seq": seq, "attempt": attempt, "ts": "2026-12-03T12:00:00+00:00", "text": text}


# What the console's socket sends when attempt 1's last two lines arrive after attempt 2's first
# two were sent: those two move up to seqs 4-5 and the stream is sent again from seq 2.
MESSAGES = [
    {"type": "lines", "lines": [line(1, 1, "a1 first"), line(2, 2, "a2 first"), line(3, 2, "a2 second")], "backlog": True},
    {"type": "inserted", "from_seq": 2},
    {"type": "lines", "lines": [line(2, 1, "a1 late 1"), line(3, 1, "a1 late 2"), line(4, 2, "a2 first"), line(5, 2, "a2 second")], "backlog": False},
    {"type": "lines", "lines": [line(6, 2, "a2 third")], "backlog": False},
    {"type": "end", "status": "Completed"},
]


@pytest.fixture
def console_socket():
    """A WebSocket server on loopback speaking the log socket's protocol, as a console would."""
    import websockets

    ready = threading.Event()
    state: dict = {}

    async def handler(ws):
        state["path"] = ws.request.path
        for message in MESSAGES:
            await ws.send(json.dumps(message))
        await ws.wait_closed()

    async def main():
        async with websockets.serve(handler, "127.0.0.1", 0) as server:
            state["port"] = server.sockets[0].getsockname()[1]
            state["stop"] = asyncio.get_running_loop().create_future()
            state["loop"] = asyncio.get_running_loop()
            ready.set()
            await state["stop"]

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield state
    state["loop"].call_soon_threadsafe(state["stop"].set_result, None)
    thread.join(10)


@pytest.mark.slow  # a WebSocket server on loopback, on a thread
def test_late_lines_of_an_earlier_attempt_are_announced_and_printed_in_their_place(console_socket):
    client = Client(Settings(url=f"http://127.0.0.1:{console_socket['port']}", token="t"))
    printed: list[tuple[int, str]] = []
    notices: list[int] = []

    status = follow(client, 7, stream="master", on_line=lambda ln: printed.append((ln["seq"], ln["text"])), on_inserted=notices.append)

    assert status == "Completed"
    assert notices == [2]
    after_notice = [text for _, text in printed[3:]]
    assert after_notice == ["a1 late 1", "a1 late 2", "a2 first", "a2 second", "a2 third"]
    assert "after=0" in console_socket["path"]
