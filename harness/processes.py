"""For the tests that start processes of the console: the checkout they run in, the interpreter,
a free port on loopback, and polling until something holds."""

from __future__ import annotations

import socket
import sys
import time
import urllib.error
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(condition: Callable[[], Any], what: str, timeout: float = 30.0, interval: float = 0.2) -> Any:
    """Poll ``condition`` until it returns something truthy; its value is returned."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while True:
        try:
            value = condition()
        except (urllib.error.URLError, OSError, KeyError, IndexError, ValueError) as exc:
            value, last_error = None, exc
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}" + (f" (last error: {last_error})" if last_error else ""))
        time.sleep(interval)
