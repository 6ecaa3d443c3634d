"""Migration 0006 gives each job's LogVolume the count its cap reads (``head``) and per-stream
tails: a job's lines stored before it all count against its cap, as they did."""

from __future__ import annotations

import pytest

from harness.database import migrated_back

BEFORE = [("logs", "0005_logvolume_attempt_starts")]
AFTER = [("logs", "0006_logvolume_head_and_tails")]


@pytest.mark.django_db(transaction=True)
def test_the_lines_stored_before_count_against_the_cap(make_job) -> None:
    job = make_job()
    with migrated_back(BEFORE) as (migrations, old):
        old.get_model("logs", "LogVolume").objects.create(job_id=job.pk, lines=1234, dropped=5, markers={"master": 1201})
        new = migrations.migrate(AFTER)
        volume = new.get_model("logs", "LogVolume").objects.get(job_id=job.pk)
        assert (volume.lines, volume.head, volume.dropped, volume.markers, volume.tails) == (1234, 1234, 5, {"master": 1201}, {})
