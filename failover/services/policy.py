"""The Job Failover policy: judge a failed run, then re-place it, refuse it, or give up.

Order for a run that stopped while its job was Running with failover on:
``Running → Pending - failoverinprogress`` (event: the exit) → gather evidence (probe the
node, its kernel log, the run's last lines; no transaction open) → classify →
hardware: exclude the faulty node, mark it unhealthy, count the failover and leave the job to
placement (``→ Running`` on a healthy node, resuming from its latest checkpoint); non-hardware:
``→ Pending - internalerror``; limit spent: ``→ Pending - maxretriesexceeded``.
The verdict is stored on the attempt first, so a crash mid-way is picked up by ``redecide``.
"""
from __future__ import annotations

import logging
import signal
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agent.processes import signal_run
from agent.registry import serves_node
from failover.classify import Verdict, classify_failure, parse_kernel_xids
from failover.evidence import Finding
from failover.models import NodeHealth
from failover.probes import probe_for
from failover.services.health import record_health
from jobs.models import GPU, AttemptNode, JobAttempt, JobExclusion, Node, TrainingJob
from jobs.services.lifecycle import record_reason, transition
from jobs.services.runs import record_exit
from jobs.statuses import JobStatus
from logs.queries import last_lines

logger = logging.getLogger(__name__)

LAST_LINES = 50


def handle_failed_run(job: TrainingJob, attempt: JobAttempt, outcome: str, lost: bool) -> str:
    """The hook jobs calls when a Running job's run fails and Job Failover is on."""
    moved = transition(
        job.pk,
        JobStatus.FAILOVER_IN_PROGRESS,
        reason=f"run stopped ({outcome}); checking the node's GPUs and hardware",
        actor="failover",
        attempt=attempt.number,
        expected={JobStatus.RUNNING},
        evidence={"exit_code": attempt.exit_code, "exit_signal": attempt.exit_signal},
    )
    if not moved:
        return TrainingJob.objects.values_list("status", flat=True).get(pk=job.pk)
    return decide(job.pk, attempt.pk, lost=lost)


def gather(attempt: JobAttempt) -> tuple[list[Finding], str, list[str], dict[int, list[Finding]]]:
    """Evidence for a judgement: every node's findings (fresh probe + stored reading), kernel
    logs, and the run's last output lines."""
    findings: list[Finding] = []
    kernel_logs: list[str] = []
    per_node: dict[int, list[Finding]] = {}
    for part in attempt.placements.select_related("node"):
        node = part.node
        node_findings: list[Finding] = []
        # NVML can only be read on the machine itself; other nodes count by their stored readings.
        if node.simulated or serves_node(node.name):
            try:
                probe = probe_for(node)
                report = probe.check()
                kernel_log = probe.kernel_log()
                node_findings = list(report.findings) + parse_kernel_xids(kernel_log)
                record_health(node, report.source, node_findings, kernel_log)
                kernel_logs.append(kernel_log)
            except Exception:
                logger.exception("could not probe %s while judging job %s", node.name, attempt.job_id)
        stored = NodeHealth.objects.filter(node=node).values_list("findings", flat=True).first() or []
        for data in stored:
            finding = Finding.from_dict(data)
            if finding not in node_findings:
                node_findings.append(finding)
        per_node[node.pk] = node_findings
        findings.extend(node_findings)
    lines = last_lines(attempt.job_id, attempt=attempt.number, count=LAST_LINES)
    return findings, "\n".join(k for k in kernel_logs if k), lines, per_node


def decide(job_id: int, attempt_id: int, *, lost: bool = False) -> str:
    attempt = JobAttempt.objects.select_related("job").get(pk=attempt_id)
    job = attempt.job
    parts = list(attempt.placements.select_related("node"))
    if lost:
        names = ", ".join(p.node.name for p in parts if p.node.state == Node.State.NOT_READY) or "its node"
        verdict = Verdict(hardware=True, reason=f"node {names} lost: {attempt.cause}", evidence={"source": "heartbeat", "cause": attempt.cause})
        faulty = {p.node_id: [] for p in parts if p.node.state == Node.State.NOT_READY} or {p.node_id: [] for p in parts}
    else:
        findings, kernel_log, lines, per_node = gather(attempt)
        verdict = classify_failure(
            exit_code=attempt.exit_code, exit_signal=attempt.exit_signal, findings=findings, kernel_log=kernel_log, log_lines=lines
        )
        faulty = {node_id: f for node_id, f in per_node.items() if classify_failure(findings=f).hardware}
        if verdict.hardware and not faulty:
            # Only the run's own output told: every node it ran on is suspect.
            faulty = {p.node_id: [] for p in parts}
    JobAttempt.objects.filter(pk=attempt.pk).update(
        verdict=verdict.verdict, verdict_reason=verdict.reason[:500], evidence=verdict.evidence, judged_at=timezone.now()
    )
    return apply_verdict(job, attempt, verdict, faulty)


def apply_verdict(job: TrainingJob, attempt: JobAttempt, verdict: Verdict, faulty: dict[int, list[Finding]]) -> str:
    expected = {JobStatus.FAILOVER_IN_PROGRESS}
    if not verdict.hardware:
        transition(
            job.pk,
            JobStatus.INTERNAL_ERROR,
            reason=f"failover refused: {verdict.reason}; no hardware fault found, read the logs",
            actor="failover",
            attempt=attempt.number,
            expected=expected,
            evidence=verdict.evidence,
        )
        return JobStatus.INTERNAL_ERROR
    if job.failover_count >= settings.MAX_FAILOVERS:
        transition(
            job.pk,
            JobStatus.MAX_RETRIES_EXCEEDED,
            reason=f"failover limit ({settings.MAX_FAILOVERS}) spent; last fault: {verdict.reason}",
            actor="failover",
            attempt=attempt.number,
            expected=expected,
            evidence=verdict.evidence,
        )
        return JobStatus.MAX_RETRIES_EXCEEDED
    exclude_gpu_only = settings.FAILOVER_EXCLUDE == "gpu"
    with transaction.atomic():
        for node_id, findings in faulty.items():
            gpus = sorted({f.gpu for f in findings if f.gpu is not None}) if exclude_gpu_only else []
            for gpu in gpus or [None]:
                JobExclusion.objects.get_or_create(job=job, node_id=node_id, gpu=gpu, defaults={"reason": verdict.reason[:500]})
            if gpus:
                GPU.objects.filter(node_id=node_id, index__in=gpus).update(healthy=False, health_reason=verdict.reason[:300])
            else:
                Node.objects.filter(pk=node_id, healthy=True).update(healthy=False, health_reason=verdict.reason[:300])
        record_reason(
            job.pk,
            reason=f"hardware fault ({verdict.reason}); re-placing on a healthy node",
            expected=expected,
            actor="failover",
            attempt=attempt.number,
            evidence=verdict.evidence,
            failover_count=F("failover_count") + 1,
        )
    names = ", ".join(Node.objects.filter(pk__in=faulty).values_list("name", flat=True))
    logger.warning("job %s: hardware fault on %s (%s); failing over", job.pk, names, verdict.reason)
    return JobStatus.FAILOVER_IN_PROGRESS


def redecide() -> None:
    """Judge failovers a crash interrupted: exited attempts of jobs in failover with no verdict."""
    for attempt in JobAttempt.objects.filter(
        job__status=JobStatus.FAILOVER_IN_PROGRESS, state=JobAttempt.State.EXITED, verdict=""
    ).order_by("job_id", "-number"):
        if attempt.number == attempt.job.attempts.order_by("-number").values_list("number", flat=True).first():
            decide(attempt.job_id, attempt.pk)


def sweep_lost_nodes() -> None:
    """Nodes whose agent stopped reporting are lost; their runs end and fail over."""
    deadline = timezone.now() - timedelta(seconds=settings.NODE_HEARTBEAT_TIMEOUT)
    for node in Node.objects.filter(state=Node.State.READY, last_heartbeat__lt=deadline):
        silent = int((timezone.now() - node.last_heartbeat).total_seconds())
        reason = f"no heartbeat for {silent}s"
        if not Node.objects.filter(pk=node.pk, state=Node.State.READY).update(state=Node.State.NOT_READY, health_reason=f"lost: {reason}"):
            continue
        logger.warning("node %s lost: %s", node.name, reason)
        now = timezone.now()
        for part in AttemptNode.objects.filter(node=node, ended_at__isnull=True, attempt__state__in=[JobAttempt.State.RUNNING, JobAttempt.State.PLACED]).select_related("attempt"):
            AttemptNode.objects.filter(pk=part.pk).update(ended_at=now)
            terminate_orphan(part)
            record_exit(part.attempt, exit_code=None, exit_signal=None, cause=f"node {node.name} lost ({reason})", lost=True)


def terminate_orphan(part: AttemptNode) -> None:
    """Where the lost node's processes are reachable from here (simulated nodes), end them."""
    signal_run(part, signal.SIGKILL)


def control_round() -> None:
    sweep_lost_nodes()
    redecide()


