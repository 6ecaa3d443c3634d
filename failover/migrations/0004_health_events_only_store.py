"""NodeHealth's JSON evidence (findings, kernel lines) moves into HealthEvent rows, the one store
of node evidence (which gains a finding's ``expected``); what a reading first showed keeps the
time it was first seen."""

from datetime import datetime

from django.db import migrations, models


def move_evidence(apps, schema_editor):
    NodeHealth = apps.get_model("failover", "NodeHealth")
    HealthEvent = apps.get_model("failover", "HealthEvent")

    def when(stamp, default):
        try:
            return datetime.fromisoformat(stamp)
        except (TypeError, ValueError):
            return default

    for health in NodeHealth.objects.all().iterator():
        known = set(HealthEvent.objects.filter(node_id=health.node_id).values_list("message", flat=True))
        events = []
        for data in health.findings or []:
            if not isinstance(data, dict) or not data.get("kind") or data.get("from_kernel"):
                continue
            message = str(data.get("detail") or data["kind"])[:500]
            events.append(HealthEvent(
                node_id=health.node_id, at=when(data.get("seen"), health.checked_at), kind=str(data["kind"])[:32],
                gpu=data.get("gpu") if isinstance(data.get("gpu"), int) else None,
                xid=data.get("xid") if isinstance(data.get("xid"), int) else None,
                value=data.get("value") if isinstance(data.get("value"), int) else None,
                expected=data.get("expected") if isinstance(data.get("expected"), int) else None,
                source=health.source[:16], message=message,
            ))  # fmt: skip
        for line, stamp in (health.kernel_seen or {}).items():
            text = str(line)[:500]
            if text and text not in known:
                known.add(text)
                # Stored as a plain kernel line: the reader parses its Xid from the text.
                events.append(HealthEvent(node_id=health.node_id, at=when(stamp, health.checked_at), kind="kernel",
                                          source="kmsg", message=text))  # fmt: skip
        HealthEvent.objects.bulk_create(events)


class Migration(migrations.Migration):
    dependencies = [
        ("failover", "0003_failover_health_events"),
    ]

    operations = [
        migrations.AddField(model_name="healthevent", name="expected", field=models.BigIntegerField(blank=True, null=True)),
        migrations.RunPython(move_evidence, migrations.RunPython.noop),
        migrations.RemoveField(model_name="nodehealth", name="findings"),
        migrations.RemoveField(model_name="nodehealth", name="kernel_log"),
        migrations.RemoveField(model_name="nodehealth", name="kernel_seen"),
    ]
