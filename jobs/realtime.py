"""Live updates: the names of the Channels groups, and publishing to them from sync code.

Publish only after commit (``transaction.on_commit``) so a client never sees what a rollback
takes back. From the embedded node agent's thread, messages are handed to the server's own event
loop: the in-memory channel layer lives there and is not thread-safe.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

logger = logging.getLogger(__name__)

_server_loop: asyncio.AbstractEventLoop | None = None
_server_thread: int | None = None


def jobs_group() -> str:
    """Every job's status changes (the list page)."""
    return "jobs"


def job_group(job_id: int) -> str:
    """One job's status changes (its detail page, its log sockets)."""
    return f"job-{job_id}"


def job_metrics_group(job_id: int) -> str:
    """One job's progress and checkpoints (its detail page); the list pages get them on ``jobs``."""
    return f"job-{job_id}-metrics"


def log_group(job_id: int, stream: str) -> str:
    return f"job-{job_id}-log-{stream}"


def remember_server_loop() -> None:
    """Called from inside the ASGI server's event loop (see ``console.asgi``)."""
    global _server_loop, _server_thread
    _server_loop = asyncio.get_running_loop()
    _server_thread = threading.get_ident()


def publish(group: str, message: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    loop = _server_loop
    try:
        if loop is not None and loop.is_running() and threading.get_ident() != _server_thread:
            asyncio.run_coroutine_threadsafe(layer.group_send(group, message), loop)
        else:
            async_to_sync(layer.group_send)(group, message)
    except Exception:
        # Live updates are best effort: the database already holds the truth.
        logger.exception("could not publish to %s", group)
