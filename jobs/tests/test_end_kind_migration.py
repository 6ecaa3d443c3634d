"""Migration 0015 gives every attempt that ended before it its end kind, read from the words the
console wrote then; from there on the kind alone decides (``jobs.backends.outcomes``)."""

from __future__ import annotations

import pytest

from harness.database import migrated_back
from jobs.backends.facts import EndKind

BEFORE = [("jobs", "0014_registry_credential_encrypted")]
AFTER = [("jobs", "0015_end_kind")]

# (state, cause) → the kind the migration names
HISTORIC = [
    ("exited", "exit code 1", "exited"),
    ("exited", "killed by SIGKILL", "signaled"),
    ("exited", "out of memory: the run needed more than its memory limit and the kernel killed it", "oom"),
    ("exited", "PID limit reached: the run kept its process limit (a fork loop?) and the platform ended it", "pids"),
    ("exited", "project storage limit reached: project p's running jobs used 3 GiB", "storage"),
    ("exited", "preempted by Slurm (job 4) for higher-priority work", "preempted"),
    ("exited", "Slurm ended job 4: TIMEOUT", "time_limit"),
    ("exited", "Slurm ended job 4: NODE_FAIL", "node_lost"),
    ("exited", "Slurm ended job 4: CANCELLED (by 0)", "cancelled"),
    ("exited", "killed by SIGKILL: Slurm job 4 CANCELLED, its runner left no exit record", "supervisor_lost"),
    ("exited", "node node-a lost (no heartbeat for 12s)", "node_lost"),
    ("exited", "fatal GPU event (Xid 79 on GPU 0); the run did not exit after SIGKILL", "hung_after_kill"),
    ("exited", "the run's supervisor process was lost", "supervisor_lost"),
    ("exited", "the run's exit record was unreadable", "unreadable"),
    ("abandoned", "launch failed: no such directory", "launch_failed"),
    ("abandoned", "job is Stopped", "abandoned"),
    ("running", "", ""),
]


@pytest.mark.django_db(transaction=True)
def test_the_ends_before_the_migration_are_given_their_kinds() -> None:
    with migrated_back(BEFORE) as (migrations, old):
        owner = old.get_model("auth", "User").objects.create(username="owner")
        project = old.get_model("jobs", "Project").objects.create(name="p")
        job = old.get_model("jobs", "TrainingJob").objects.create(name="j", owner=owner, project=project, image="i", command="c")
        Attempt = old.get_model("jobs", "JobAttempt")
        for number, (state, cause, _) in enumerate(HISTORIC, 1):
            Attempt.objects.create(job=job, number=number, state=state, cause=cause)

        migrations.migrate(AFTER)
        from jobs.models import JobAttempt

        assert {kind for _, _, kind in HISTORIC} - {""} == set(EndKind)
        assert list(JobAttempt.objects.order_by("number").values_list("end_kind", flat=True)) == [kind for _, _, kind in HISTORIC]
