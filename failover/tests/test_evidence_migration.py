"""Migration 0004 moves NodeHealth's JSON evidence into HealthEvent rows (the one store) and
drops the JSON fields: nothing a node had shown is lost, and each keeps when it was first seen."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from harness.database import migrated_back

BEFORE = [("failover", "0003_failover_health_events")]
AFTER = [("failover", "0004_health_events_only_store")]


@pytest.mark.django_db(transaction=True)
def test_the_json_evidence_becomes_events_with_their_first_seen_times() -> None:
    with migrated_back(BEFORE) as (migrations, old):
        from jobs.models import Node  # the jobs tables stay at their latest migration

        node = Node.objects.create(name="node-m")
        seen = timezone.now() - timedelta(hours=2)
        line = "NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=python, GPU has fallen off the bus."
        old.get_model("failover", "NodeHealth").objects.create(
            node_id=node.pk, source="nvml",
            findings=[{"kind": "ecc_uncorrected", "gpu": 2, "value": 3, "detail": "3 uncorrected", "seen": seen.isoformat()},
                      {"kind": "gpu_count", "value": 3, "expected": 4, "detail": "fewer GPUs than expected", "seen": seen.isoformat()},
                      {"kind": "xid", "gpu": 0, "xid": 79, "detail": line, "seen": seen.isoformat(), "from_kernel": True},
                      "not a finding"],
            kernel_seen={line: seen.isoformat()},
        )  # fmt: skip

        new = migrations.migrate(AFTER)
        events = {(e.kind, e.gpu, e.value, e.expected, e.source, e.message, e.at)
                  for e in new.get_model("failover", "HealthEvent").objects.all()}  # fmt: skip
        assert events == {
            ("ecc_uncorrected", 2, 3, None, "nvml", "3 uncorrected", seen),
            ("gpu_count", None, 3, 4, "nvml", "fewer GPUs than expected", seen),
            ("kernel", None, None, None, "kmsg", line, seen),  # its Xid is read from the text, as every line's
        }
        fields = {f.name for f in new.get_model("failover", "NodeHealth")._meta.get_fields()}
        assert not fields & {"findings", "kernel_seen", "kernel_log"}
