"""Live updates: the names of the Channels groups, and publishing to them from sync code.

Publish only after commit (``transaction.on_commit``) so a client never sees what a rollback
takes back. Three ways a message travels:

* scale-out (the Redis layer): every process publishes to Redis, which reaches every Daphne;
* inside the embedded server process: from other threads (the node agent, sync views) the
  message is handed to the server's own event loop, since the in-memory layer is not thread-safe;
* from another process in the embedded default (``manage.py``, scripts): the in-memory layer here
  has no listeners, so the message also goes to the server's local relay (``jobs.live_relay``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.db import connections

from jobs import live_relay

logger = logging.getLogger(__name__)

_server_loop: asyncio.AbstractEventLoop | None = None
_server_thread: int | None = None
_relay: live_relay.Relay | None = None


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


async def serve_other_processes() -> live_relay.Relay | None:
    """In the server process, inside its loop: remember the loop and, with the in-memory layer,
    take other local processes' messages on ``CONSOLE_VAR_DIR/live.sock``. Idempotent."""
    global _relay
    remember_server_loop()
    layer = get_channel_layer()
    if _relay is None and isinstance(layer, InMemoryChannelLayer):
        relay = live_relay.Relay(live_relay.socket_path(settings.VAR_DIR), layer.group_send, database=database_name())
        if await relay.start():
            _relay = relay
    return _relay


def database_name() -> str:
    """Which database the jobs live in: the relay forwards only what concerns its own."""
    return str(connections["default"].settings_dict["NAME"])


def publish(group: str, message: dict[str, Any]) -> None:
    publish_many([(group, message)])


def publish_many(items: list[tuple[str, dict[str, Any]]]) -> None:
    """Publish several messages, in order, with one hand-over to the layer: a placement round's
    hundreds of status changes cost one event-loop round trip, not two per job."""
    layer = get_channel_layer()
    if layer is None or not items:
        return

    async def send_all() -> None:
        for group, message in items:
            try:
                await layer.group_send(group, message)
            except Exception:
                # Live updates are best effort: the database already holds the truth.
                logger.exception("could not publish to %s", group)

    loop = _server_loop
    try:
        if loop is not None and loop.is_running():
            if threading.get_ident() != _server_thread:
                asyncio.run_coroutine_threadsafe(send_all(), loop)
            else:
                async_to_sync(send_all)()
            return
        if isinstance(layer, InMemoryChannelLayer):
            # Not the server: hand them to the server's relay, if one listens. The local layer
            # below still gets them (this process's own consumers, e.g. in tests).
            path, database = live_relay.socket_path(settings.VAR_DIR), database_name()
            for group, message in items:
                live_relay.send(path, group, message, database)
        async_to_sync(send_all)()
    except Exception:
        logger.exception("could not publish %s message(s)", len(items))
