"""A minimal asyncio WebSocket client (RFC 6455): enough for the log socket.

Text and binary messages (fragmented or not), ping → pong, close handshake. No extensions are
offered, so frames are never compressed. ``recv()`` returns ``(receive_time, text)`` where the
time is ``time.time()`` taken as soon as the message's last byte was read, before any decoding.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import struct
import time


class WebSocketClosed(Exception):
    def __init__(self, code: int | None, reason: str = "") -> None:
        super().__init__(f"closed with code {code} {reason}".strip())
        self.code = code
        self.reason = reason


class HandshakeError(Exception):
    pass


def _mask(payload: bytes, key: bytes) -> bytes:
    if not payload:
        return payload
    # XOR with the repeated key through int arithmetic: fast enough for the few frames we send.
    n = len(payload)
    rep = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(rep, "big")).to_bytes(n, "big")


class WebSocket:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.close_code: int | None = None
        self.close_reason = ""
        self.closed = False

    async def _send_frame(self, opcode: int, payload: bytes = b"") -> None:
        key = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack("!H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack("!Q", n)
        self.writer.write(head + key + _mask(payload, key))
        await self.writer.drain()

    async def send_text(self, text: str) -> None:
        await self._send_frame(0x1, text.encode("utf-8"))

    async def recv(self) -> tuple[float, str]:
        """The next data message as (receive time, text). Raises WebSocketClosed at close."""
        if self.closed:
            raise WebSocketClosed(self.close_code, self.close_reason)
        parts: list[bytes] = []
        while True:
            b0, b1 = await self.reader.readexactly(2)
            fin, opcode = b0 & 0x80, b0 & 0x0F
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack("!H", await self.reader.readexactly(2))
            elif n == 127:
                (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
            key = await self.reader.readexactly(4) if b1 & 0x80 else None
            payload = await self.reader.readexactly(n) if n else b""
            if key:
                payload = _mask(payload, key)
            if opcode == 0x9:  # ping
                await self._send_frame(0xA, payload)
                continue
            if opcode == 0xA:  # pong
                continue
            if opcode == 0x8:  # close
                self.close_code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                self.close_reason = payload[2:].decode("utf-8", "replace")
                self.closed = True
                with contextlib.suppress(ConnectionError, RuntimeError):
                    await self._send_frame(0x8, payload[:2])
                self.writer.close()
                raise WebSocketClosed(self.close_code, self.close_reason)
            parts.append(payload)
            if fin:
                now = time.time()
                return now, b"".join(parts).decode("utf-8")

    async def close(self, code: int = 1000) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self._send_frame(0x8, struct.pack("!H", code))
            # Give the server a moment to answer; we don't need its close frame.
            self.writer.close()
            await asyncio.wait_for(self.writer.wait_closed(), timeout=2)
        except (TimeoutError, ConnectionError, RuntimeError, OSError):
            pass


async def connect(host: str, port: int, path: str, headers: dict[str, str] | None = None, *, timeout: float = 10.0) -> WebSocket:
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 24), timeout)
    key = base64.b64encode(os.urandom(16)).decode()
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host}:{port}",
        "Upgrade: websocket",
        "Connection: Upgrade",
        f"Sec-WebSocket-Key: {key}",
        "Sec-WebSocket-Version: 13",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    if " 101 " not in status + " ":
        writer.close()
        raise HandshakeError(f"handshake refused: {status}")
    return WebSocket(reader, writer)
