"""Health checks on the node agent: apply injected faults, probe GPUs, mark faulty nodes.

``HealthChecker`` is a node-agent plug-in (``agent.plugins``): the agent makes one per agent and
calls ``on_round`` on every round.
"""
from __future__ import annotations

import json
import logging
import signal
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agent.plugins import AgentView
from agent.processes import signal_run
from failover.classify import Verdict, classify_failure, parse_kernel_xids
from failover.evidence import Finding, FindingKind, HealthReport
from failover.models import NodeHealth, SimulatedFault
from failover.probes import HealthProbe, probe_for
from jobs.models import GPU, AttemptNode, Node

logger = logging.getLogger(__name__)


class HealthChecker:
    """Per agent: the probes of its nodes and when each was last checked."""

    def __init__(self, agent: AgentView) -> None:
        self.agent = agent
        self.probes: dict[str, HealthProbe] = {}
        self.last_check: dict[str, object] = {}
        self.lock = threading.Lock()
        _checkers.add(self)

    def probe(self, node: Node):
        """The node's probe, made once and kept for the agent's life (an NVML probe holds NVML
        and its Xid event set; the failover policy reads the same one, ``local_probe``)."""
        with self.lock:
            if node.name not in self.probes:
                self.probes[node.name] = probe_for(node)
            return self.probes[node.name]

    def close(self) -> None:
        """Release the probes (NVML: the event set freed, ``nvmlShutdown``)."""
        with self.lock:
            probes, self.probes = list(self.probes.values()), {}
        for probe in probes:
            close = getattr(probe, "close", None)
            if close is not None:
                close()

    def check(self, node: Node) -> tuple[HealthReport, str]:
        """Probe a node now, store the reading, mark it (and its GPUs) unhealthy on a hardware fault."""
        probe = self.probe(node)
        report = probe.check()
        kernel_log = probe.kernel_log()
        record_health(node, report, kernel_log, probe.gpu_by_pci())
        self.last_check[node.name] = timezone.now()
        return report, kernel_log

    def on_round(self) -> None:
        """One agent round: make injected faults bite, and probe nodes whose check is due."""
        self.apply_injected_faults()
        interval = timedelta(seconds=settings.HEALTH_CHECK_INTERVAL)
        now = timezone.now()
        for node in Node.objects.filter(name__in=self.agent.node_names):
            last = self.last_check.get(node.name)
            if last is None or now - last >= interval:
                try:
                    self.check(node)
                except Exception:
                    logger.exception("health check of %s failed", node.name)

    def apply_injected_faults(self) -> None:
        """Kill the training processes on GPUs that just got an injected fault, as the fault would."""
        now = timezone.now()
        faults = SimulatedFault.objects.filter(node__name__in=self.agent.node_names, applied_at__isnull=True, cleared_at__isnull=True)
        for fault in faults.select_related("node"):
            parts = AttemptNode.objects.filter(node=fault.node, runner_pid__isnull=False, ended_at__isnull=True).select_related("attempt")
            for part in parts:
                if fault.gpu is not None and fault.gpu not in part.gpu_indices:
                    continue
                if signal_run(part, signal.SIGKILL):
                    logger.warning("job %s: %s killed its run on %s", part.attempt.job_id, fault, fault.node.name)
            SimulatedFault.objects.filter(pk=fault.pk).update(applied_at=now)
            # The reading is taken at once, so the node leaves placement before anything lands on it.
            self.check(fault.node)


_checkers: weakref.WeakSet = weakref.WeakSet()
_spare_probes: dict[str, HealthProbe] = {}  # nodes served here with no health checker (kept too)
_spare_lock = threading.Lock()


def local_probe(node: Node) -> HealthProbe:
    """The probe of a node read from this process: the one its agent's health checker keeps, so
    a judgement never makes a probe of its own (no second ``nvmlInit``, no event set registered
    only after the fault); failing that, one kept here per node."""
    for checker in list(_checkers):
        if node.name in checker.agent.node_names:
            return checker.probe(node)
    with _spare_lock:
        if node.name not in _spare_probes:
            _spare_probes[node.name] = probe_for(node)
        return _spare_probes[node.name]


KERNEL_LINES_KEPT = 500


def finding_key(data: dict) -> str:
    return json.dumps({k: v for k, v in data.items() if k not in ("seen", "from_kernel")}, sort_keys=True)


def seen_at(data: dict) -> datetime | None:
    try:
        return datetime.fromisoformat(data["seen"])
    except (KeyError, TypeError, ValueError):
        return None


def record_health(node: Node, report: HealthReport, kernel_log: str, gpu_by_pci: Mapping[str, int] | None = None) -> bool:
    """Store a reading; a hardware fault first seen since the node was last cleared makes the
    node unhealthy until an operator clears it.

    Each finding keeps the time a reading first showed it, each kernel-log line the time it was
    first read, so an old line still in the ring never re-flags a cleared node and a verdict can
    count only what appeared during its attempt. NVML Xid events are read once (the event set is
    drained), so they are kept until the node is cleared instead of being overwritten by the next
    reading.
    """
    now = timezone.now()
    stamp = now.isoformat()
    previous = NodeHealth.objects.filter(node=node).first()
    cleared_at = previous.cleared_at if previous else None
    old_kernel = previous.kernel_seen if previous else {}
    old_findings = previous.findings if previous else []
    old_seen = {finding_key(d): d.get("seen") for d in old_findings}

    lines = [line.strip() for line in (kernel_log or "").splitlines() if line.strip()][-KERNEL_LINES_KEPT:]
    kernel_seen = {line: old_kernel.get(line, stamp) for line in lines}
    stored: dict[str, dict] = {}
    for finding in report.findings:
        data = finding.to_dict()
        stored.setdefault(finding_key(data), dict(data, seen=old_seen.get(finding_key(data)) or stamp))
    for line in lines:
        for finding in parse_kernel_xids(line, gpu_by_pci):
            data = finding.to_dict()
            stored.setdefault(finding_key(data), dict(data, seen=kernel_seen[line], from_kernel=True))
    for data in old_findings:  # events already drained from NVML stay until the node is cleared
        if data.get("kind") == FindingKind.XID and not data.get("from_kernel"):
            stored.setdefault(finding_key(data), data)
    fresh = [Finding.from_dict(d) for d in stored.values() if cleared_at is None or (seen_at(d) or now) > cleared_at]
    verdict = classify_failure(findings=fresh, kernel_log="")
    with transaction.atomic():
        NodeHealth.objects.update_or_create(
            node=node,
            defaults={
                "checked_at": now, "source": report.source, "findings": list(stored.values()),
                "kernel_log": "\n".join(lines)[-20000:], "kernel_seen": kernel_seen,
            },
        )
        if verdict.hardware:
            bad_gpus = {f.gpu for f in fresh if f.gpu is not None}
            for index in bad_gpus:
                reasons = "; ".join(f.detail or f.kind for f in fresh if f.gpu == index)
                GPU.objects.filter(node=node, index=index).update(healthy=False, health_reason=reasons[:300])
            # Per node, as the service does; FAILOVER_EXCLUDE=gpu keeps the node's healthy GPUs in use
            # when the fault names its GPUs (any node-wide finding still takes the node out).
            node_wide = not bad_gpus or any(f.gpu is None and f.kind != FindingKind.XID for f in fresh)
            if settings.FAILOVER_EXCLUDE != "gpu" or node_wide:
                Node.objects.filter(pk=node.pk).update(healthy=False, health_reason=verdict.reason[:300])
                if node.healthy:
                    logger.warning("node %s marked unhealthy: %s", node.name, verdict.reason)
    return verdict.hardware


@dataclass(frozen=True)
class ScopedEvidence:
    """A node's evidence that bears on one attempt: on its GPUs (or node-wide), first seen since
    the attempt was placed."""

    findings: list[Finding]  # NVML (or simulated) readings
    kernel_findings: list[Finding]  # Xid lines of the kernel log
    kernel_log: str  # the kernel log's other lines (hardware messages, the OOM killer)

    def judge(self, **facts) -> Verdict:
        return classify_failure(findings=self.findings, kernel_findings=self.kernel_findings, kernel_log=self.kernel_log, **facts)


def scoped_evidence(node: Node, *, gpus: Sequence[int], since: datetime) -> ScopedEvidence:
    health = NodeHealth.objects.filter(node=node).first()
    if health is None:
        return ScopedEvidence([], [], "")
    mine = set(gpus)
    findings: list[Finding] = []
    kernel_findings: list[Finding] = []
    for data in health.findings:
        seen = seen_at(data)
        if seen is not None and seen < since:
            continue
        finding = Finding.from_dict(data)
        if finding.gpu is not None and finding.gpu not in mine:
            continue
        (kernel_findings if data.get("from_kernel") else findings).append(finding)
    lines = []
    for line, stamp in (health.kernel_seen or {}).items():
        seen = seen_at({"seen": stamp})
        if (seen is None or seen >= since) and not parse_kernel_xids(line):
            lines.append(line)
    return ScopedEvidence(findings, kernel_findings, "\n".join(lines))
