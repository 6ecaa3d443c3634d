"""Verdicts count only node evidence scoped to the attempt; the run's own words never take a node
down; exclusions are lifted by a repair; a job with no node left ends; one fault counts once."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from failover.models import HealthEvent, NodeHealth, SimulatedFault
from failover.services import policy
from failover.services.faults import clear_node
from failover.tests.exits import report_exit
from harness.database import refuse_once
from jobs.models import GPU, JobAttempt, JobEvent, JobExclusion, Node, TrainingJob
from jobs.services.placement import place_waiting_jobs
from jobs.services.runs import run_started
from jobs.statuses import JobStatus
from logs.services import RawLine, ingest_lines

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_local_agent")]

ECC_LINE = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def start(job) -> JobAttempt:
    [attempt] = [a for a in place_waiting_jobs() if a.job_id == job.pk]
    assert run_started(attempt)
    return JobAttempt.objects.get(pk=attempt.pk)


def fail(attempt: JobAttempt, *lines: str, exit_code: int = 1) -> str:
    now = timezone.now()
    ingest_lines(job_id=attempt.job_id, stream="master", attempt=attempt.number, lines=[RawLine(i + 1, now, t) for i, t in enumerate(lines)])
    return report_exit(attempt, exit_code=exit_code, exit_signal=None)


def node_of(attempt: JobAttempt) -> Node:
    return attempt.placements.get().node


def test_a_run_that_only_printed_an_ecc_error_fails_over_but_leaves_every_node_healthy(make_job, nodes, settings):
    settings.FAILOVER_REPAIR_WAIT = 0
    job = make_job()
    used = []
    for _ in range(3):
        attempt = start(job)
        used.append(node_of(attempt).name)
        assert fail(attempt, ECC_LINE) == JobStatus.FAILOVER_IN_PROGRESS
        attempt.refresh_from_db()
        assert attempt.verdict == "hardware" and attempt.evidence["scope"] == "this job only"
    assert used == ["node-a", "node-b", "node-c"]
    assert set(JobExclusion.objects.filter(job=job).values_list("node__name", flat=True)) == set(used)
    assert Node.objects.filter(healthy=False).count() == 0
    assert GPU.objects.filter(healthy=False).count() == 0
    # Another user's job still finds GPUs at once.
    other = make_job(name="someone-else")
    assert [a.job_id for a in place_waiting_jobs()] == [other.pk]


def test_a_job_excluded_from_every_node_ends_with_a_clear_reason(make_job, nodes, settings):
    settings.FAILOVER_REPAIR_WAIT = 0
    job = make_job()
    for _ in range(3):
        fail(start(job), ECC_LINE)
    policy.control_round()
    job.refresh_from_db()
    assert job.status == JobStatus.MAX_RETRIES_EXCEEDED
    assert "no node left that can hold the job" in job.status_reason
    assert "node-a, node-b, node-c" in job.status_reason


def test_a_repair_lifts_the_exclusion_and_the_waiting_job_is_placed_again(make_job, nodes, settings):
    settings.FAILOVER_REPAIR_WAIT = 600
    job = make_job()
    for _ in range(3):
        fail(start(job), ECC_LINE)
    policy.control_round()
    assert place_waiting_jobs() == []
    job.refresh_from_db()
    assert job.status == JobStatus.FAILOVER_IN_PROGRESS
    assert "3 nodes excluded after faults" in job.status_reason
    clear_node(Node.objects.get(name="node-b"), actor="test")
    assert not JobExclusion.objects.filter(job=job, node__name="node-b").exists()
    [attempt] = place_waiting_jobs()
    assert (attempt.job_id, node_of(attempt).name) == (job.pk, "node-b")


def test_an_ecc_count_on_another_gpu_does_not_make_a_cuda_oom_hardware(make_job, nodes):
    job = make_job()
    attempt = start(job)
    node = node_of(attempt)
    assert attempt.placements.get().gpu_indices == [0]
    # GPU 3 of the same node has an uncorrectable ECC error (and its Xid 48 kernel line).
    SimulatedFault.objects.create(node=node, gpu=3, kind="ecc", applied_at=timezone.now())
    assert fail(attempt, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB") == JobStatus.INTERNAL_ERROR
    job.refresh_from_db()
    assert "CUDA out of memory" in job.status_reason


def test_an_old_xid_in_the_kernel_log_does_not_make_an_import_error_hardware(make_job, nodes, monkeypatch):
    from failover.probes import SimulatedProbe

    old = "NVRM: Xid (PCI:0000:18:00): 79, pid=0, name=python, GPU has fallen off the bus."
    yesterday = timezone.now() - timedelta(days=1)
    node = Node.objects.get(name="node-a")
    # Read yesterday, then the node was repaired; the line is still in the kernel's ring.
    HealthEvent.objects.create(node=node, at=yesterday, kind="xid", xid=79, source="kmsg", message=old)
    NodeHealth.objects.create(node=node, cleared_at=yesterday + timedelta(hours=1))
    monkeypatch.setattr(SimulatedProbe, "kernel_log", lambda self: old if self.node_name == "node-a" else "")
    job = make_job()
    attempt = start(job)
    assert node_of(attempt) == node
    assert fail(attempt, "ModuleNotFoundError: No module named 'foo'") == JobStatus.INTERNAL_ERROR
    node.refresh_from_db()
    assert node.healthy


def test_a_fault_on_the_attempts_gpu_during_the_run_is_hardware_and_marks_the_gpu(make_job, nodes):
    job = make_job()
    attempt = start(job)
    node = node_of(attempt)
    SimulatedFault.objects.create(node=node, gpu=0, kind="xid", xid=79, applied_at=timezone.now())
    assert fail(attempt, "", exit_code=-9) == JobStatus.FAILOVER_IN_PROGRESS
    attempt.refresh_from_db()
    assert attempt.evidence["xid"] == 79 and "scope" not in attempt.evidence
    # Xid 79 is the GPU's fault: that GPU leaves placement; the job itself avoids the whole node.
    node.refresh_from_db()
    assert node.healthy and not GPU.objects.get(node=node, index=0).healthy
    assert JobExclusion.objects.filter(job=job, node=node, gpu=None).exists()


def test_one_fault_is_counted_once_when_a_second_worker_judges_at_the_same_time(make_job, nodes, monkeypatch):
    job = make_job()
    attempt = start(job)
    gather = policy.gather

    def gather_while_another_worker_runs_its_round(*args, **kwargs):
        policy.judge_exited()  # a second control worker, while the first is still gathering evidence
        return gather(*args, **kwargs)

    monkeypatch.setattr(policy, "gather", gather_while_another_worker_runs_its_round)
    fail(attempt, ECC_LINE)
    job.refresh_from_db()
    assert job.failover_count == 1
    assert JobEvent.objects.filter(job=job, reason__startswith="hardware fault").count() == 1


def test_a_claim_whose_judge_went_silent_is_taken_over(make_job, nodes, monkeypatch):
    job = make_job()
    attempt = start(job)
    monkeypatch.setattr(policy, "decide", lambda *a, **k: JobStatus.FAILOVER_IN_PROGRESS)  # the judge crashes
    fail(attempt, ECC_LINE)
    monkeypatch.undo()
    attempt.refresh_from_db()
    assert attempt.verdict == policy.JUDGING
    policy.judge_exited()  # a fresh claim is left alone
    assert TrainingJob.objects.get(pk=job.pk).failover_count == 0
    JobAttempt.objects.filter(pk=attempt.pk).update(judged_at=timezone.now() - policy.CLAIM_TIMEOUT - timedelta(seconds=1))
    policy.judge_exited()
    policy.judge_exited()
    job.refresh_from_db()
    assert job.failover_count == 1 and JobAttempt.objects.get(pk=attempt.pk).verdict == "hardware"


def test_the_failover_count_never_passes_the_limit(make_job, nodes, settings):
    job = make_job()
    attempt = start(job)
    TrainingJob.objects.filter(pk=job.pk).update(failover_count=settings.MAX_FAILOVERS)
    assert fail(attempt, ECC_LINE) == JobStatus.MAX_RETRIES_EXCEEDED
    assert TrainingJob.objects.get(pk=job.pk).failover_count == settings.MAX_FAILOVERS


@pytest.mark.django_db(transaction=True)
def test_a_judge_the_database_refused_gives_its_claim_back_and_the_next_round_counts_once(make_job, nodes, monkeypatch):
    """A judge whose read the database refused (held by another writer past its busy timeout)
    stores nothing and keeps no claim: the next round judges the attempt at once, not after
    ``CLAIM_TIMEOUT``, and the fault counts once."""
    from django.db import OperationalError

    job = make_job()
    attempt = start(job)
    refused = refuse_once(monkeypatch, policy, "gather")
    with pytest.raises(OperationalError):
        fail(attempt, ECC_LINE)
    assert refused and JobAttempt.objects.get(pk=attempt.pk).verdict == ""
    policy.judge_exited()  # the next control round
    job.refresh_from_db()
    assert job.failover_count == 1 and job.status == JobStatus.FAILOVER_IN_PROGRESS
    assert JobAttempt.objects.get(pk=attempt.pk).verdict == "hardware"


@pytest.mark.django_db(transaction=True)
def test_a_write_refused_after_the_verdict_is_stored_judges_again_and_still_counts(make_job, nodes, monkeypatch):
    """Seen in CI: the verdict's compare-and-swap committed, then a write acting on it was refused;
    the next judge found the verdict taken ("judged by another worker") and placement re-placed
    the job with no exclusion and no failover counted. The verdict now commits with its consequences."""
    from django.db import OperationalError

    job = make_job()
    attempt = start(job)
    refused = refuse_once(monkeypatch, policy, "record_reason")
    with pytest.raises(OperationalError):
        fail(attempt, ECC_LINE)
    assert refused and JobAttempt.objects.get(pk=attempt.pk).verdict == ""  # the verdict rolled back with the write
    policy.judge_exited()  # the next control round
    job.refresh_from_db()
    assert job.failover_count == 1 and JobAttempt.objects.get(pk=attempt.pk).verdict == "hardware"
    assert job.exclusions.exists()


@pytest.mark.django_db(transaction=True)
def test_a_failed_run_whose_move_to_failover_was_refused_is_judged_by_the_next_control_round(make_job, nodes, monkeypatch):
    """The attempt closed, Job Failover claimed it, and the move to FAILOVER_IN_PROGRESS was refused:
    the claim and the move roll back together, and the control round's sweep for closed attempts
    judges the run (once) instead of leaving the job Running."""
    from django.db import OperationalError

    from jobs.services import runs
    from jobs.services.control import control_round

    job = make_job()
    attempt = start(job)
    refuse_once(monkeypatch, policy, "transition", lambda job_id, to, **_: to == JobStatus.FAILOVER_IN_PROGRESS)
    with pytest.raises(OperationalError):
        fail(attempt, ECC_LINE)
    job.refresh_from_db()
    assert job.status == JobStatus.RUNNING and JobAttempt.objects.get(pk=attempt.pk).verdict == ""  # nothing half-done

    control_round()  # within the grace: a report may still be in flight
    assert TrainingJob.objects.get(pk=job.pk).status == JobStatus.RUNNING
    monkeypatch.setattr(runs, "CLOSE_GRACE", runs.CLOSE_GRACE * 0)
    control_round()
    job.refresh_from_db()
    assert job.failover_count == 1 and JobAttempt.objects.get(pk=attempt.pk).verdict == "hardware"
    assert job.status in (JobStatus.FAILOVER_IN_PROGRESS, JobStatus.RUNNING)  # re-placed by the same round
    control_round()
    assert TrainingJob.objects.get(pk=job.pk).failover_count == 1


@pytest.mark.django_db(transaction=True)
def test_a_judge_that_fails_for_another_reason_keeps_its_claim_so_the_next_rounds_go_on(make_job, nodes, monkeypatch):
    """A judge that raised anything but a database error (a bug in the evidence, say) would raise
    again at every round and hold every placement up: its claim stays until ``CLAIM_TIMEOUT``."""
    job = make_job()
    attempt = start(job)

    def broken(*args, **kwargs):
        raise ValueError("an unreadable piece of evidence")

    monkeypatch.setattr(policy, "gather", broken)
    with pytest.raises(ValueError):
        fail(attempt, ECC_LINE)
    monkeypatch.undo()
    assert JobAttempt.objects.get(pk=attempt.pk).verdict == policy.JUDGING
    policy.judge_exited()  # the next control round leaves the claim alone
    assert JobAttempt.objects.get(pk=attempt.pk).verdict == policy.JUDGING
    JobAttempt.objects.filter(pk=attempt.pk).update(judged_at=timezone.now() - policy.CLAIM_TIMEOUT - timedelta(seconds=1))
    policy.judge_exited()  # the claim timed out: taken over and judged
    job.refresh_from_db()
    assert job.failover_count == 1 and JobAttempt.objects.get(pk=attempt.pk).verdict == "hardware"
