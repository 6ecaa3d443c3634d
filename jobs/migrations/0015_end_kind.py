"""How an attempt's run ended, as a kind (``JobAttempt.end_kind``, jobs.backends.facts.EndKind)
beside its words (``cause``). Attempts that ended before are given their kind from the words the
console wrote then; the code decides by the kind alone from here on."""

from django.db import migrations, models
from django.db.models import Q

# (kind, the words that name it), the first match wins; the texts are those written until now.
HISTORIC = [
    ("launch_failed", Q(state="abandoned", cause__startswith="launch failed: ")),
    ("abandoned", Q(state="abandoned")),
    ("supervisor_lost", Q(cause__contains="its runner left no exit record")),
    ("oom", Q(cause__startswith="out of memory")),
    ("pids", Q(cause__startswith="PID limit reached")),
    ("storage", Q(cause__startswith="storage limit reached") | Q(cause__startswith="project storage limit reached")),
    ("preempted", Q(cause__startswith="preempted by Slurm")),
    ("time_limit", Q(cause__startswith="Slurm ended job ", cause__contains=": TIMEOUT")),
    ("node_lost", Q(cause__startswith="Slurm ended job ", cause__contains=": NODE_FAIL")),
    ("cancelled", Q(cause__startswith="Slurm ended job ")),
    ("node_lost", Q(cause__startswith="node ", cause__contains=" lost (")),
    ("hung_after_kill", Q(cause__startswith="fatal GPU event (")),
    ("supervisor_lost", Q(cause="the run's supervisor process was lost")),
    ("unreadable", Q(cause="the run's exit record was unreadable")),
    ("signaled", Q(cause__startswith="killed by ")),
    ("exited", Q(cause__startswith="exit code ")),
]


def name_the_ends(apps, schema_editor):
    JobAttempt = apps.get_model("jobs", "JobAttempt")
    for kind, words in HISTORIC:
        JobAttempt.objects.filter(words, end_kind="").exclude(cause="").update(end_kind=kind)


class Migration(migrations.Migration):
    dependencies = [
        ("jobs", "0014_registry_credential_encrypted"),
    ]

    operations = [
        migrations.AddField(
            model_name="jobattempt",
            name="end_kind",
            field=models.CharField(blank=True, max_length=24),
        ),
        migrations.RunPython(name_the_ends, migrations.RunPython.noop),
    ]
