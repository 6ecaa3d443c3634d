"""The live pages' WebSocket: ``/ws/training-jobs/`` (every visible job) or ``?job=<id>`` (one).

Messages to the client (JSON):
* ``{"type": "ready", "now": iso}`` once the socket listens: the client fetches a catch-up
  snapshot then (``jobs:live``), so nothing that changed before is missed;
* ``{"type": "job", "job": {snapshot, see ``console.live``}, "from": "Running", "now": iso}`` on
  each status change;
* ``{"type": "deleted", "job": id, "now": iso}`` when a job the user could see is deleted;
* ``{"type": "progress", "job": id, "progress": {...}, "checkpoints": [...], "now": iso}`` as
  the log tells progress (at most about once a second per job) and on each checkpoint.
Staff get every job; others the jobs they may see, checked per message. The socket is one-way.
Close codes: 4400 bad parameters, 4401 not authenticated, 4404 no such job (or not yours), 4403
access revoked (access is asked again every ``SOCKET_ACCESS_RECHECK`` seconds).
"""

from __future__ import annotations

import time
from typing import Any, TypeGuard
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from console.live import server_now, visible_snapshot
from jobs.models import Project, TrainingJob
from jobs.realtime import job_group, job_metrics_group, jobs_group
from jobs.sockets import AccessRechecks

# How long "not visible to this user" is believed before asking the database again.
HIDDEN_TTL = 30.0


class BadParameters(ValueError):
    pass


def parse_job_param(query_string: bytes) -> int | None:
    try:
        params = parse_qs(query_string.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadParameters("the query string is not valid UTF-8") from None
    if "job" not in params:
        return None
    raw = params["job"][-1]
    if not raw.isdigit() or len(raw) > 18 or int(raw) == 0:
        raise BadParameters("job must be a positive integer id")
    return int(raw)


class TrainingJobsConsumer(AccessRechecks, AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.groups_joined: list[str] = []
        self.visible: dict[int, bool] = {}
        self.hidden_since: dict[int, float] = {}
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401, reason="authentication required")
            return
        self.user = user
        try:
            self.job_id = parse_job_param(self.scope.get("query_string", b""))
        except BadParameters as exc:
            await self.close(code=4400, reason=str(exc)[:120])
            return
        if self.job_id is None:
            groups = [jobs_group()]
        else:
            if not await self.may_see(self.job_id):
                await self.close(code=4404, reason="no such training job")
                return
            groups = [job_group(self.job_id), job_metrics_group(self.job_id)]
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
            self.groups_joined.append(group)
        await self.send_json({"type": "ready", "now": server_now()})
        self.start_access_rechecks()

    async def disconnect(self, code: int) -> None:
        await self.stop_access_rechecks()
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def still_allowed(self, user) -> bool:
        """A fresh user row and no remembered answers; one job's socket closes when that job is
        no longer visible, the list's stays open and shows only what is visible now."""
        self.user = user
        self.visible.clear()
        self.hidden_since.clear()
        return self.job_id is None or await self.may_see(self.job_id)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        await self.send_json({"type": "error", "detail": "this socket only sends; fetch the catch-up snapshot instead"})

    async def decode_json(self, text_data: str) -> Any:
        try:
            return await super().decode_json(text_data)
        except ValueError:
            return None

    # --- group messages ----------------------------------------------------------------------
    async def job_status(self, event: dict[str, Any]) -> None:
        job_id = event.get("job")
        if not self.wants(job_id) or self.known_hidden(job_id):
            return
        found = await self.snapshot(job_id)
        self.remember(job_id, found is not None)
        if found is not None:
            await self.send_json({"type": "job", "job": found, "from": event.get("from", ""), "now": server_now()})

    async def job_deleted(self, event: dict[str, Any]) -> None:
        """A deleted job leaves the open lists (and its own page) of those who could see it."""
        job_id = event.get("job")
        if not self.wants(job_id):
            return
        if self.user.is_staff or self.visible.get(job_id) or await self.could_see(event.get("owner"), event.get("project")):
            self.visible.pop(job_id, None)
            await self.send_json({"type": "deleted", "job": job_id, "now": server_now()})

    async def job_progress(self, event: dict[str, Any]) -> None:
        job_id = event.get("job")
        if not self.wants(job_id) or not await self.may_see(job_id):
            return
        await self.send_json(
            {
                "type": "progress",
                "job": job_id,
                "progress": event.get("progress"),
                "checkpoints": event.get("checkpoints", []),
                "now": server_now(),
            }
        )

    # --- access ------------------------------------------------------------------------------
    def wants(self, job_id: object) -> TypeGuard[int]:
        return isinstance(job_id, int) and (self.job_id is None or job_id == self.job_id)

    def known_hidden(self, job_id: int) -> bool:
        since = self.hidden_since.get(job_id)
        return since is not None and time.monotonic() - since < HIDDEN_TTL

    def remember(self, job_id: int, visible: bool) -> None:
        if visible:
            self.visible[job_id] = True
            self.hidden_since.pop(job_id, None)
        else:
            self.visible.pop(job_id, None)
            self.hidden_since[job_id] = time.monotonic()

    async def may_see(self, job_id: int) -> bool:
        if self.user.is_staff or self.visible.get(job_id):
            return True
        if self.known_hidden(job_id):
            return False
        visible = await self.is_visible(job_id)
        self.remember(job_id, visible)
        return visible

    @database_sync_to_async
    def is_visible(self, job_id: int) -> bool:
        return TrainingJob.objects.visible_to(self.user).filter(pk=job_id).exists()

    @database_sync_to_async
    def could_see(self, owner_id: Any, project_id: Any) -> bool:
        return owner_id == self.user.pk or Project.objects.filter(pk=project_id, members=self.user).exists()

    @database_sync_to_async
    def snapshot(self, job_id: int) -> dict[str, Any] | None:
        return visible_snapshot(self.user, job_id)
