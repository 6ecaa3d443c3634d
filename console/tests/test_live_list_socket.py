"""The list socket tells of jobs created and deleted, to those who may see them only."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async

from console.tests.test_live_socket import connect
from jobs.services.actions import delete_job
from jobs.services.lifecycle import transition
from jobs.statuses import JobStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def test_a_created_job_reaches_its_owners_list_and_not_an_outsiders(make_job, owner, outsider):
    mine = await connect(owner)
    theirs = await connect(outsider)
    job = await database_sync_to_async(make_job)()
    message = await mine.receive_json_from()
    assert message["type"] == "job" and message["job"]["id"] == job.pk and message["job"]["status"] == "Pending"
    assert message["from"] == ""
    assert await theirs.receive_nothing(timeout=0.5)
    await mine.disconnect()
    await theirs.disconnect()


async def test_a_deleted_job_leaves_its_owners_list_and_an_outsider_hears_nothing(make_job, owner, outsider):
    job = await database_sync_to_async(make_job)()
    await database_sync_to_async(transition)(job.pk, JobStatus.STOPPED, reason="stopped")
    mine = await connect(owner)
    theirs = await connect(outsider)
    job_id = job.pk
    await database_sync_to_async(delete_job)(job)
    message = await mine.receive_json_from()
    assert message == {"type": "deleted", "job": job_id, "now": message["now"]}
    assert await theirs.receive_nothing(timeout=0.5)
    await mine.disconnect()
    await theirs.disconnect()
