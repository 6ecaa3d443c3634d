"""``Communicator``: channels' in-memory WebSocket test client, each of its waits for the
consumer bounded by a minute instead of its one-second default. A fast test must keep no
wall-clock deadline a loaded machine can miss (``docs/testing.md``): beside CI's other lane and a
``stress-ng`` on both cores, a consumer took more than a second to accept a connection. An answer
that comes is taken at once; only a consumer that never answers waits the whole minute."""

from __future__ import annotations

from typing import Any

from channels.testing import WebsocketCommunicator

WAIT = 60.0


class Communicator(WebsocketCommunicator):
    async def connect(self, timeout: float = WAIT) -> Any:
        return await super().connect(timeout)

    async def receive_output(self, timeout: float = WAIT) -> Any:
        return await super().receive_output(timeout)

    async def receive_from(self, timeout: float = WAIT) -> Any:
        return await super().receive_from(timeout)

    async def receive_json_from(self, timeout: float = WAIT) -> Any:
        return await super().receive_json_from(timeout)

    async def disconnect(self, code: int = 1000, timeout: float = WAIT) -> None:
        await super().disconnect(code, timeout)
