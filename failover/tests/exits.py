"""A run's bad end as the product handles it, for tests that drive the services without an agent
loop: the node's agent stores its node's reading (``HealthChecker.before_failed_exit``), then
reports the exit; the control plane's next round judges the attempt (``policy.judge_exited``)."""

from __future__ import annotations

from failover.probes import probe_for
from failover.services import health, policy
from jobs.backends.facts import Ended, exited
from jobs.models import AttemptNode, JobAttempt, TrainingJob
from jobs.services.runs import part_exited, record_exit


def read_nodes(attempt: JobAttempt) -> None:
    for part in attempt.placements.select_related("node"):
        probe = probe_for(part.node)
        health.record_health(part.node, probe.check(), probe.kernel_log(), probe.gpu_by_pci())


def report_exit(attempt: JobAttempt, *, exit_code: int | None, exit_signal: int | None, fact: Ended | None = None) -> str:
    """The attempt's exit reported (after its nodes were read) and judged; the job's status then.
    ``fact``: how it ended, where it says more than the exit."""
    fact = fact or exited(exit_code, exit_signal)
    if exit_signal or exit_code not in (0,) or not fact.plain:
        read_nodes(attempt)
    record_exit(attempt, fact)
    policy.judge_exited()
    return TrainingJob.objects.values_list("status", flat=True).get(pk=attempt.job_id)


def report_part_exit(part: AttemptNode, *, exit_code: int | None, exit_signal: int | None, fact: Ended | None = None) -> list[AttemptNode]:
    """One rank's end reported as its agent does, then a control round's judge."""
    others = part_exited(part, fact or exited(exit_code, exit_signal))
    policy.judge_exited()
    return others
