from django.db import migrations, models
from django.db.models import F


def head_from_lines(apps, schema_editor):
    """A job's lines stored before this migration all count against its cap, as they did."""
    apps.get_model("logs", "LogVolume").objects.update(head=F("lines"))


class Migration(migrations.Migration):
    dependencies = [
        ("logs", "0005_logvolume_attempt_starts"),
    ]

    operations = [
        migrations.AddField(
            model_name="logvolume",
            name="head",
            field=models.BigIntegerField(default=0),
        ),
        migrations.AddField(
            model_name="logvolume",
            name="tails",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.RunPython(head_from_lines, migrations.RunPython.noop),
    ]
