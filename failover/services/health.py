"""Health checks on the node agent: apply injected faults, probe GPUs, mark faulty nodes.

``HealthChecker`` is a node-agent plug-in (``agent.plugins``): the agent makes one per agent and
calls ``on_round`` on every round.
"""
from __future__ import annotations

import logging
import signal
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agent.plugins import AgentView
from agent.processes import signal_run
from failover.classify import classify_failure, parse_kernel_xids
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

    def probe(self, node: Node):
        if node.name not in self.probes:
            self.probes[node.name] = probe_for(node)
        return self.probes[node.name]

    def check(self, node: Node) -> tuple[HealthReport, str]:
        """Probe a node now, store the reading, mark it (and its GPUs) unhealthy on a hardware fault."""
        probe = self.probe(node)
        report = probe.check()
        kernel_log = probe.kernel_log()
        findings = list(report.findings) + [f for f in parse_kernel_xids(kernel_log) if f not in report.findings]
        record_health(node, report.source, findings, kernel_log)
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


def record_health(node: Node, source: str, findings: list[Finding], kernel_log: str) -> bool:
    """Store a reading; a hardware fault makes the node unhealthy until an operator clears it."""
    verdict = classify_failure(findings=findings, kernel_log="")
    with transaction.atomic():
        NodeHealth.objects.update_or_create(
            node=node,
            defaults={"checked_at": timezone.now(), "source": source, "findings": [f.to_dict() for f in findings], "kernel_log": kernel_log[-20000:]},
        )
        if verdict.hardware:
            bad_gpus = {f.gpu for f in findings if f.gpu is not None}
            for index in bad_gpus:
                reasons = "; ".join(f.detail or f.kind for f in findings if f.gpu == index)
                GPU.objects.filter(node=node, index=index).update(healthy=False, health_reason=reasons[:300])
            # Per node, as the service does; FAILOVER_EXCLUDE=gpu keeps the node's healthy GPUs in use
            # when the fault names its GPUs (a kernel-log Xid line names a PCI address, not an index;
            # any other node-wide finding still takes the node out).
            node_wide = not bad_gpus or any(f.gpu is None and f.kind != FindingKind.XID for f in findings)
            if settings.FAILOVER_EXCLUDE != "gpu" or node_wide:
                Node.objects.filter(pk=node.pk).update(healthy=False, health_reason=verdict.reason[:300])
                if node.healthy:
                    logger.warning("node %s marked unhealthy: %s", node.name, verdict.reason)
    return verdict.hardware
