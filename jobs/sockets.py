"""Access on long-lived sockets: what a user may see is asked again while the socket is open.

A consumer that mixes in ``AccessRechecks`` re-reads its user (active, staff) every
``SOCKET_ACCESS_RECHECK`` seconds and asks ``still_allowed``; when the answer is no — the user
left the project, lost staff, was deactivated — the socket closes with 4403.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model

logger = logging.getLogger(__name__)

ACCESS_REVOKED = 4403


class AccessRechecks:
    """A mixin of a Channels consumer (which gives ``scope`` and ``close``)."""

    access_task: asyncio.Task | None = None
    scope: dict[str, Any]

    if TYPE_CHECKING:

        async def close(self, code: int | bool | None = None, reason: str | None = None) -> None: ...

    def start_access_rechecks(self) -> None:
        self.access_task = asyncio.ensure_future(self.recheck_access())

    async def stop_access_rechecks(self) -> None:
        if self.access_task is not None:
            self.access_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.access_task

    async def recheck_access(self) -> None:
        while True:
            await asyncio.sleep(settings.SOCKET_ACCESS_RECHECK)
            user = await self.fresh_user()
            if user is None or not await self.still_allowed(user):
                logger.info("socket of user %s closed: access revoked", self.scope["user"].pk)
                await self.close(code=ACCESS_REVOKED, reason="access revoked")
                return

    @database_sync_to_async
    def fresh_user(self):
        return get_user_model().objects.filter(pk=self.scope["user"].pk, is_active=True).first()

    async def still_allowed(self, user) -> bool:
        """Whether ``user`` (as the database has it now) may still follow this socket."""
        raise NotImplementedError
