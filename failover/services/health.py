"""Health checks on the node agent: apply injected faults, probe GPUs, mark faulty nodes.

``HealthChecker`` is a node-agent plug-in (``agent.plugins``): the agent makes one per agent,
calls ``on_start`` when its loop starts (the health monitor's thread starts: NVML events, injected
faults and the kernel log are drained there, ``failover.services.monitor``), ``on_reconcile``
inside the agent's read-only reconcile (its nodes' rows and their open simulated faults are read
there, so a round needs no query), ``on_round`` on every round (the periodic reading; the
monitor's pass too where its thread is not running) and ``on_shutdown`` when it stops (the thread
ends, NVML is shut down).

A real node is probed every ``HEALTH_CHECK_INTERVAL`` (NVML, no query) and its reading stored only
when it differs from the last one stored; a simulated node's reading changes only with its
injected faults, so it is taken when the set of open faults changes (``inject_fault`` and
``clear_node`` wake the agent, whose reconcile reads them).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from agent.plugins import AgentView
from agent.sampling import GpuReading, use_gpu_reader
from failover.classify import NodeFault, Verdict, classify_failure, node_fault, parse_kernel_xids
from failover.evidence import Finding, FindingKind, HealthReport
from failover.models import HealthEvent, NodeHealth
from failover.probes import HealthProbe, probe_for
from failover.services.monitor import HealthMonitor, NodeEvidenceMonitor, kernel_line_event
from jobs.backends.facts import LocalKernel, NodeCheckFiles
from jobs.models import GPU, Node

logger = logging.getLogger(__name__)


class HealthChecker:
    """Per agent: the probes of its nodes and when each was last checked."""

    def __init__(self, agent: AgentView) -> None:
        self.agent = agent
        self.probes: dict[str, HealthProbe] = {}
        self.last_check: dict[str, object] = {}
        self.node_rows: dict[str, Node] | None = None  # from the agent's reconcile (None: read when needed)
        self.open_faults: dict[str, frozenset] | None = None  # simulated node → its open faults (id, applied)
        self.stored: dict[str, object] = {}  # node → what its last stored reading showed
        self.next_check: dict[str, float] = {}
        self.next_poll = 0.0
        self.lock = threading.Lock()
        # A cluster's nodes that are not this machine (Slurm's) are watched through what each
        # node's own health check hands over (the agent names the directory).
        self.monitor: HealthMonitor
        match agent.evidence_source():
            case NodeCheckFiles(directory=directory):
                self.monitor = NodeEvidenceMonitor(self, directory=directory)
            case LocalKernel():
                self.monitor = HealthMonitor(self)
        _checkers.add(self)
        use_gpu_reader(ProbeUsageReader())

    def on_start(self) -> None:
        self.monitor.start()

    def on_shutdown(self) -> None:
        self.close()

    def probe(self, node: Node):
        """The node's probe, made once and kept for the agent's life (an NVML probe holds NVML
        and its Xid event set; the usage sampler and the reading before a failed exit use the
        same one)."""
        with self.lock:
            if node.name not in self.probes:
                self.probes[node.name] = probe_for(node)
            return self.probes[node.name]

    def close(self) -> None:
        """Stop the monitor's thread, then release the probes (NVML: the event set freed,
        ``nvmlShutdown``); a closed checker reads no node's usage any more."""
        _checkers.discard(self)
        self.monitor.stop()
        with self.lock:
            probes, self.probes = list(self.probes.values()), {}
        for probe in probes:
            close = getattr(probe, "close", None)
            if close is not None:
                close()

    def check(self, node: Node, *, on_change: bool = False, news: bool = False) -> tuple[HealthReport, str]:
        """Probe a node now, store the reading, mark it (and its GPUs) unhealthy on a hardware
        fault. ``on_change``: store it only if it differs from the last reading stored. ``news``:
        the monitor just stored events (its kernel lines among them; health is derived from them
        whatever the reading adds)."""
        probe = self.probe(node)
        report = probe.check()
        kernel_log = probe.kernel_log()
        shown = (json.dumps([f.to_dict() for f in report.findings], sort_keys=True), kernel_log)
        if news or not on_change or self.stored.get(node.name) != shown:
            since = datetime.fromtimestamp(self.monitor.since_of(node.name), tz=UTC)
            record_health(node, report, kernel_log, probe.gpu_by_pci(), since=since, news=news)
            self.stored[node.name] = shown
        self.last_check[node.name] = timezone.now()
        return report, kernel_log

    def before_failed_exit(self, part) -> None:
        """A run on one of this agent's nodes ended badly: what its node shows now is stored
        (the monitor's pass: NVML's events, injected faults, the kernel log; then a reading)
        before the exit is reported, so the verdict finds it."""
        node = next((n for n in self.nodes() if n.pk == part.node_id), None)
        if node is None:
            return
        self.monitor.poll()
        self.check(node)

    def nodes(self) -> list[Node]:
        """The agent's nodes: as its last reconcile read them (read here once if it has not)."""
        if self.node_rows is None:
            self.node_rows = {n.name: n for n in Node.objects.filter(name__in=self.agent.node_names)}
        return list(self.node_rows.values())

    def on_reconcile(self, nodes: list[Node]) -> None:
        """Inside the agent's read-only reconcile: its nodes, and the simulated ones' open faults."""
        from failover.models import SimulatedFault

        self.node_rows = {n.name: n for n in nodes}
        simulated = [n.name for n in nodes if n.simulated]
        faults: dict[str, set] = {name: set() for name in simulated}
        if simulated:
            for name, pk, applied in SimulatedFault.objects.filter(node__name__in=simulated, cleared_at__isnull=True).values_list(
                "node__name", "pk", "applied_at"
            ):
                faults[name].add((pk, applied is not None))
        self.open_faults = {name: frozenset(found) for name, found in faults.items()}

    def unapplied_faults(self, node: Node) -> bool:
        """Whether the node may have injected faults not applied yet (unknown: True)."""
        if self.open_faults is None or node.name not in self.open_faults:
            return True
        return any(not applied for _, applied in self.open_faults[node.name])

    def next_round_in(self) -> float:
        now = time.monotonic()
        due = [self.next_check.get(n.name, 0.0) for n in (self.node_rows or {}).values() if not n.simulated]
        if not self.monitor.running:
            due.append(self.next_poll)
        if self.open_faults and any(self.stored.get(name) != faults for name, faults in self.open_faults.items()):
            due.append(now)
        return max(0.0, min(due) - now) if due else math.inf

    def on_round(self) -> None:
        """One agent round: the monitor's pass where its thread is not running (injected faults
        bite, events drained), a reading of the real nodes whose check is due (stored if it
        changed), and of the simulated nodes whose open faults changed."""
        now = time.monotonic()
        if not self.monitor.running and now >= self.next_poll:
            self.next_poll = now + self.monitor.interval
            self.monitor.poll()
        for node in self.nodes():
            try:
                if node.simulated:
                    faults = (self.open_faults or {}).get(node.name, frozenset())
                    if self.stored.get(node.name) != faults:
                        self.check(node)
                        self.stored[node.name] = faults
                elif now >= self.next_check.get(node.name, 0.0):
                    self.next_check[node.name] = now + settings.HEALTH_CHECK_INTERVAL
                    self.check(node, on_change=True)
            except Exception:
                logger.exception("health check of %s failed", node.name)


class ProbeUsageReader:
    """The agent's usage sampler (``agent.sampling``) reads real GPUs through the probe the
    node's health checker already holds (NVML initialised once); probes without ``usage`` (the
    simulated one) give nothing, and simulated nodes get the sampler's synthetic readings."""

    def read(self, node_name: str, gpu_indices: Sequence[int]) -> dict[int, GpuReading]:
        for checker in list(_checkers):
            probe = checker.probes.get(node_name)
            if probe is not None and hasattr(probe, "usage"):
                return {i: GpuReading(util=u, mem_mb=round(m), power_w=round(w, 1)) for i, (u, m, w) in probe.usage(gpu_indices).items()}
        return {}


_checkers: weakref.WeakSet = weakref.WeakSet()


def live_checkers() -> list[HealthChecker]:
    """The health checkers of this process not closed (and not yet collected)."""
    return list(_checkers)


KERNEL_LINES_KEPT = 500


def reading_key(kind: str, gpu: int | None, xid: int | None, value: int | None, expected: int | None, message: str) -> tuple:
    return (kind, gpu, xid, value, expected, message[:500])


def record_health(
    node: Node,
    report: HealthReport,
    kernel_log: str,
    gpu_by_pci: Mapping[str, int] | None = None,
    *,
    since: datetime | None = None,
    news: bool = False,
) -> bool:
    """Store a reading as health events, then derive the node's health from its evidence.

    The events are the one store of node evidence (``HealthEvent``, append-only, pruned by
    age): a finding of the reading is appended unless one alike (kind, GPU, Xid, value, text)
    was stored since the node was last cleared, so an event's time is when a reading first showed
    it; a kernel-log line is appended once ever (by its text), so an old line still in the ring
    never flags a cleared node again. ``NodeHealth`` keeps only when and how the node was last
    read. ``since``: the evidence health is derived from starts no earlier (the monitor's start:
    a kernel line written before it is history an earlier agent judged). Returns whether the
    evidence shows a fault (False when the reading added nothing: health was derived when the
    events it repeats were stored). ``news``: events were just stored by their reader (the
    monitor): derive health even if the reading adds none.
    """
    now = timezone.now()
    health = NodeHealth.objects.filter(node=node).first()
    cleared_at = health.cleared_at if health else None
    events: list[HealthEvent] = []
    if report.findings:
        kinds = {finding.kind for finding in report.findings}
        stored = HealthEvent.objects.filter(node=node, kind__in=kinds).exclude(source__in=KERNEL_SOURCES)
        if cleared_at is not None:
            stored = stored.filter(at__gte=cleared_at)
        # Distinct keys only: a standing condition the monitor stores again every minute is one row here.
        rows = stored.order_by().values_list("kind", "gpu", "xid", "value", "expected", "message").distinct()
        known = {reading_key(*row) for row in rows}
        for finding in report.findings:
            message = (finding.detail or finding.kind)[:500]
            key = reading_key(finding.kind, finding.gpu, finding.xid, finding.value, finding.expected, message)
            if key not in known:
                known.add(key)
                events.append(HealthEvent(node=node, at=now, kind=finding.kind, gpu=finding.gpu, xid=finding.xid,
                                          value=finding.value, expected=finding.expected, source=report.source,
                                          message=message))  # fmt: skip
    lines = [line.strip()[:500] for line in (kernel_log or "").splitlines() if line.strip()][-KERNEL_LINES_KEPT:]
    if lines:
        seen = set(HealthEvent.objects.filter(node=node, message__in=lines).values_list("message", flat=True))
        source = "simulated-kmsg" if report.source == "simulated" else "kmsg"
        for line in dict.fromkeys(lines):
            if line not in seen:
                event = kernel_line_event(node, line, at=now, source=source, gpu_by_pci=dict(gpu_by_pci or {}))
                event.fatal = False  # nothing was stopped for it here
                events.append(event)
    with transaction.atomic():
        if events:
            HealthEvent.objects.bulk_create(events)
        NodeHealth.objects.update_or_create(node=node, defaults={"checked_at": now, "source": report.source})
    if not events and not news and health is not None:
        return False  # nothing new: health (sticky) was derived when the events were stored
    return derive_health(node, cleared_at=cleared_at, since=since) is not None


def derive_health(node: Node, *, cleared_at: datetime | None = None, since: datetime | None = None) -> NodeFault | None:
    """The one writer of node and GPU health from evidence: the node's events since it was last
    cleared (and since ``since``), judged alone (``classify.node_fault``: only what is a fault by
    itself, scoped as the Xid table scopes it), mark what they show broken (``mark_unhealthy``).
    Health is sticky: only an operator's Mark healthy (``faults.clear_node``) returns it."""
    starts = [moment for moment in (cleared_at, since) if moment is not None]
    evidence = scoped_evidence(node, gpus=None, since=max(starts) if starts else None)
    fault = node_fault(evidence.findings, evidence.kernel_findings, evidence.kernel_log)
    if fault is not None:
        mark_unhealthy(node, fault)
    return fault


def mark_unhealthy(node: Node, fault: NodeFault, *, since: datetime | None = None) -> None:
    """The one writer of node and GPU health from node-side evidence, scoped as the Xid table
    (``failover.xids``, from NVIDIA's catalogue) scopes the fault: each GPU a GPU-scoped fault
    names (an Xid whose fix is a GPU reset, a lost GPU) is marked and the node's other GPUs stay
    placeable; the node itself only for a node's fault (a reboot, the fabric, a NIC, a finding that
    names no GPU). Each keeps the reason and time of the fault that first marked it, until an
    operator marks it healthy (``clear_node``). What a failed job itself avoids is the policy's
    (``FAILOVER_EXCLUDE``), not this."""
    at = Coalesce(F("unhealthy_since"), Value(since or timezone.now()))
    for index in sorted(fault.gpus):
        reason = fault.reasons.get(index) or fault.reason
        GPU.objects.filter(node=node, index=index, healthy=True).update(healthy=False, health_reason=reason[:300], unhealthy_since=at)
    if fault.node:
        reason = fault.reasons.get(None) or fault.reason
        if Node.objects.filter(pk=node.pk, healthy=True).update(healthy=False, health_reason=reason[:300], unhealthy_since=at):
            logger.warning("node %s marked unhealthy: %s", node.name, reason)


@dataclass(frozen=True)
class ScopedEvidence:
    """A node's evidence that bears on one attempt: on its GPUs (or node-wide), first seen since
    the attempt was placed."""

    findings: list[Finding]  # NVML (or simulated) readings
    kernel_findings: list[Finding]  # Xid lines of the kernel log
    kernel_log: str  # the kernel log's other lines (hardware messages, the OOM killer)

    def judge(self, **facts) -> Verdict:
        return classify_failure(findings=self.findings, kernel_findings=self.kernel_findings, kernel_log=self.kernel_log, **facts)


# Where kernel-log lines come from: the machine's kernel log (``failover.kmsg``) or a simulated
# node's (the simulated probe writes the lines its injected faults would make the driver print).
KERNEL_SOURCES = ("kmsg", "journalctl", "dmesg", "simulated-kmsg")


def scoped_evidence(node: Node, *, gpus: Sequence[int] | None, since: datetime | None) -> ScopedEvidence:
    """Findings from the node's health events on ``gpus`` or node-wide (every GPU for None) since
    ``since``: what a verdict on an attempt placed then may count, or (``gpus`` None) what node
    health is derived from. Readings become findings, kernel Xid/SXid lines kernel findings (parsed
    once more, ``parse_kernel_xids``, for the cause an Xid line may name), other kernel lines text;
    each once, in the order first stored."""
    mine = None if gpus is None else set(gpus)
    findings: dict[Finding, None] = {}
    kernel_findings: dict[Finding, None] = {}
    lines: dict[str, None] = {}
    events = HealthEvent.objects.filter(node=node)
    if since is not None:
        events = events.filter(at__gte=since)
    for event in events.order_by("at", "id"):
        if mine is not None and event.gpu is not None and event.gpu not in mine:
            continue
        if event.source in KERNEL_SOURCES:
            if event.kind in (FindingKind.XID, FindingKind.SXID):
                for finding in parse_kernel_xids(event.message):
                    kernel_findings[dataclasses.replace(finding, gpu=event.gpu) if finding.kind == FindingKind.XID else finding] = None
            else:
                lines[event.message] = None
            continue
        if event.kind in FindingKind.ALL:
            finding = Finding(kind=event.kind, gpu=event.gpu, xid=event.xid, value=event.value, expected=event.expected,
                              detail=event.message)  # fmt: skip
            findings[finding] = None
    return ScopedEvidence(list(findings), list(kernel_findings), "\n".join(lines))


def attempt_events(attempt, *, limit: int = 5) -> list[HealthEvent]:
    """The health events on an attempt's GPUs (or node-wide) while it was placed, latest first:
    what the Failover tab shows beside the verdict."""

    until = (attempt.ended_at or timezone.now()) + timedelta(seconds=5)
    where = Q()
    for part in attempt.placements.all():
        where |= Q(node_id=part.node_id) & (Q(gpu__isnull=True) | Q(gpu__in=list(part.gpu_indices)))
    if not where:
        return []
    return list(HealthEvent.objects.filter(where, at__gte=attempt.created_at, at__lte=until).select_related("node").order_by("-at", "-id")[:limit])
