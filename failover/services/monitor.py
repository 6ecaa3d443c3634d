"""The node health monitor: one long-lived thread per agent, next to (not inside) the agent's round.
It reads the database only when there is news (an injected fault its agent's reconcile saw, an
event to store, a run to kill); a quiet pass is NVML and the kernel log alone.

Every ``HEALTH_MONITOR_INTERVAL`` seconds it drains each node's events — NVML's Xid event set
(every call under the probe's watchdog), the faults injected into simulated GPUs, and the
machine's kernel log from its cursor (``failover.kmsg``) — and stores each as a
:class:`~failover.models.HealthEvent`. A **fatal** event (GPU lost, an Xid whose catalogued
resolution is a GPU reset or a node reboot, a driver recovery action, "fallen off the bus") on a
GPU a run holds stops that run at once: SIGKILL to every process of it (the agent's ``signal``), so a rank
hung on a dead GPU cannot keep its job ``Running``. Its exit then reaches Job Failover as any exit
does; if the run's supervisor has still not reported an exit ``FATAL_EXIT_WAIT`` seconds later
(processes stuck in the driver), the monitor reports the rank ended itself. A fatal event also
takes a fresh reading at once, so the node leaves placement before anything lands on it.

Kernel text becomes evidence in one place, :func:`kernel_line_event`, through one parser
(``failover.xids.parse_kernel_line``): a record counts only as its driver writes it, its message
*starting* with the driver's text (``NVRM: Xid …``, ``nvidia-nvswitchN: SXid …``, ``NVRM: … fallen off
the bus``, ``pcieport <dev>: AER: …``, ``mlx5_core …``). The kernel's record of a job's own trap or
segfault (``traps: <comm>[<pid>] … in <file>[…]``) quotes names the job chose and is never evidence:
it stops no run and marks nothing, whatever driver text those names spell. The same holds for the
lines a Slurm node's own check hands over (:class:`NodeEvidenceMonitor`): they are parsed again here.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, close_old_connections, transaction
from django.utils import timezone

from failover.evidence import Finding, FindingKind
from failover.kmsg import KernelLine, KernelLogReader
from failover.models import EvidenceCursor, HealthEvent, NodeHealth, SimulatedFault
from failover.nodecheck import RECORD_MAX_TEXT, evidence_paths, read_json_file
from failover.probes import simulated_findings
from failover.services.cursors import Cursors, Position, file_identity, path_identity
from failover.xids import bus_id, one_line, parse_kernel_line, xid_fatal
from jobs.backends.facts import Ended, EndKind, describe
from jobs.models import AttemptNode, Node
from jobs.services import runs

logger = logging.getLogger(__name__)

# Xids that end the run on that GPU: ``failover.xids.FATAL_XIDS``, from NVIDIA's Xid catalogue
# (RESET_GPU, RESTART_BM, RESTART_VM; NVLink5 lines the driver printed Fatal). Other Xids (13, 31,
# 43, 48, 63, 94, a Nonfatal 149, ...) are judged when the run ends, not acted on.
FATAL_KINDS = frozenset({FindingKind.GPU_LOST, FindingKind.RESET_REQUIRED, FindingKind.RECOVERY_ACTION})
KERNEL_GRACE = 5.0  # seconds before the monitor started whose kernel lines still count as news
BACKLOG_KEPT = 2000
FATAL_EXIT_WAIT = 10.0  # seconds a SIGKILLed run's supervisor gets to report its exit
REPEAT_AFTER = 60.0  # the same standing condition (a GPU still lost) is stored again after this
PRUNE_EVERY = 600.0
EVIDENCE_READ_MAX = 4 * 1024 * 1024  # bytes of a node's evidence file read per pass
NODECHECK_STALE = 600.0  # seconds after which a node's silent health check is said on its page
_PCI = re.compile(r"\b((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2})\.[0-7]\b")


def is_fatal(finding: Finding) -> bool:
    if finding.kind == FindingKind.XID:
        event = parse_kernel_line(finding.detail) if finding.detail else None
        return xid_fatal(finding.xid, event.severity if event is not None else "")
    return finding.kind in FATAL_KINDS


def kernel_kind(text: str) -> str:
    event = parse_kernel_line(text)
    return event.kind if event is not None else "kernel"


class HealthMonitor:
    """The monitor of one agent's nodes. ``start()`` runs ``poll()`` on its own thread until
    ``stop()``; a round-driven agent (tests, tools) may call ``poll()`` itself instead."""

    def __init__(self, checker, *, interval: float | None = None, kernel: KernelLogReader | None = None) -> None:
        self.checker = checker
        self.interval = settings.HEALTH_MONITOR_INTERVAL if interval is None else interval
        self.kernel = kernel  # made at the first poll that needs it (KERNEL_LOG_PATH)
        self.killed: dict[int, tuple[float, str]] = {}  # AttemptNode id → (when SIGKILLed, why)
        self.stored: dict[tuple, float] = {}  # event key → when last stored (standing conditions)
        self.unsaved: dict[str, list[HealthEvent]] = {}  # node → NVML / injected events a refused write kept back
        self.pci: dict[str, dict[str, int]] = {}
        self.notes: dict[str, str] = {}  # node → the kernel-log note last written
        self.last_prune = 0.0
        self.backlog: list[KernelLine] = []  # kernel lines read but not stored yet (the database was busy)
        # Where each node's kernel evidence was read to, kept across restarts (``EvidenceCursor``):
        # what a console missed while it was down is read by the next one, once. Only a node no
        # console ever read has history: the lines its log held before the monitor started (the
        # ring's backlog) are stored as events with their own time, but neither stop a run nor
        # flag the node. Lines read past a stored position are news however old (``missed``).
        self.started = time.time() - KERNEL_GRACE
        self.since: dict[str, float] = {}  # node → the time its news starts (``started`` unless it missed some)
        self.cursors = Cursors(EvidenceCursor.Source.KERNEL)
        self.read_once: set[str] = set()  # nodes this monitor has read
        self.kernel_file: str | None = None  # which kernel log (the boot, for /dev/kmsg) the reader reads
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.lock = threading.Lock()  # one poll at a time
        self.local_nvml = True  # this machine's NVML events are its real nodes'

    # --- the thread ---------------------------------------------------------------------------
    def start(self) -> None:
        if self.thread is None or not self.thread.is_alive():
            self.stopped.clear()
            name = f"health-monitor-{self.checker.agent.name}"
            self.thread = threading.Thread(target=self.run, name=name, daemon=True)
            self.thread.start()

    @property
    def running(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        self.stopped.set()
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(timeout)
        if self.kernel is not None:
            self.kernel.close()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.poll()
            except Exception:
                logger.exception("health monitor of %s: poll failed", self.checker.agent.name)
            finally:
                close_old_connections()
            self.stopped.wait(self.interval)

    # --- one pass -----------------------------------------------------------------------------
    def poll(self) -> int:
        """Drain every source once, act on fatal events; returns how many events were stored."""
        with self.lock:
            nodes = self.checker.nodes()  # as the agent's reconcile read them: no query per pass
            lines = self.kernel_lines(nodes)
            stored = 0
            for node in nodes:
                try:
                    stored += self.poll_node(node, lines.get(node.name, []))
                except DatabaseError:
                    logger.warning("health monitor: database unavailable while polling %s; retrying", node.name)
                    self.keep_back(node, lines.get(node.name, []))
            self.escalate()
            if time.monotonic() - self.last_prune > PRUNE_EVERY:
                self.last_prune = time.monotonic()
                prune_events()
            return stored

    def since_of(self, name: str) -> float:
        """When the node's news starts: lines written earlier neither stop a run nor flag it."""
        return self.since.get(name, self.started)

    def missed(self, name: str, lines: list[KernelLine]) -> None:
        """Lines no console had read (a stored position passed, or a node read before): news
        however old, the ones written while no console read them (an outage) included."""
        if lines:
            self.since[name] = min(self.since_of(name), *(line.at for line in lines))

    def load_cursors(self, nodes: list[Node]) -> bool:
        """The stored positions of nodes read for the first time (False: the database refused;
        nothing is read this pass, so nothing missed is taken for history)."""
        try:
            self.cursors.load(nodes)
        except DatabaseError:
            logger.warning("health monitor: database unavailable while reading where the evidence was read to; retrying")
            return False
        return True

    def kernel_lines(self, nodes: list[Node]) -> dict[str, list[KernelLine]]:
        """Each node's new kernel lines: this machine's kernel log is its real nodes' (a simulated
        node has none). Each node's lines start after its stored position in that log."""
        real = [n for n in nodes if not n.simulated]
        if not real or not self.load_cursors(real):
            return {}
        if self.kernel is None:
            self.kernel = KernelLogReader(settings.KERNEL_LOG_PATH)
        lines, self.backlog = self.backlog + self.kernel.read(), []
        if self.kernel.source != "kmsg":  # journalctl or dmesg: their cursors are this process's alone
            return {node.name: lines for node in real}
        if self.kernel_file is None:
            self.kernel_file = path_identity(self.kernel.path)
        found = {}
        for node in real:
            saved = self.cursors.saved.get(node.name)
            resumed = saved if saved is not None and saved.file == self.kernel_file and self.kernel_file else None
            mine = lines if resumed is None else [line for line in lines if line.seq is None or line.seq > resumed.offset]
            if node.name in self.read_once or saved is not None:
                self.missed(node.name, mine)
            found[node.name] = mine
            self.read_once.add(node.name)
            if self.kernel_file:  # -1: read, and the log held nothing (every record is after it)
                self.cursors.advance(node.name, Position(self.kernel_file, -1 if self.kernel.seq is None else self.kernel.seq))
        return found

    def keep_back(self, node: Node, lines: list[KernelLine]) -> None:
        """Lines a refused write kept from being stored: read again at the next pass."""
        if lines:
            self.backlog = lines[-BACKLOG_KEPT:]

    def poll_node(self, node: Node, lines: list[KernelLine]) -> int:
        now = timezone.now()
        # Events read from NVML (drained: the driver will not say them again) or made from an
        # injected fault (marked applied) that a refused write kept from being stored: stored
        # now, before anything new. Kernel lines need no such care: they are read again.
        carried = self.unsaved.pop(node.name, [])
        events: list[HealthEvent] = []
        try:
            return self.store_node_events(node, lines, now, carried, events)
        except DatabaseError:
            self.unsaved[node.name] = (carried + [e for e in events if e.source in ("nvml", "simulated")])[-BACKLOG_KEPT:]
            raise

    def store_node_events(self, node: Node, lines: list[KernelLine], now: datetime, carried: list[HealthEvent], events: list[HealthEvent]) -> int:
        """``poll_node``'s work; ``events`` is filled as they are read, so a failure keeps them."""
        # GPU (None: the node) → the latest start of a run a fatal event there stops (inf: any).
        stop_gpus: dict[int | None, float] = {e.gpu: math.inf for e in carried if e.fatal}
        injected = any(e.source == "simulated" for e in carried)
        if node.simulated:
            pending = self.checker.unapplied_faults(node)  # the reconcile read them; a fault injected wakes it
            faults = SimulatedFault.objects.filter(node=node, applied_at__isnull=True, cleared_at__isnull=True) if pending else []
            for fault in faults:
                if not SimulatedFault.objects.filter(pk=fault.pk, applied_at__isnull=True).update(applied_at=now):
                    continue  # another monitor (or the agent's round) applied it
                injected = True
                stop_gpus[fault.gpu] = math.inf  # an injected fault ends the runs on its GPU, as the real one would
                for finding in simulated_findings(fault.kind, fault.gpu, fault.xid):
                    events.append(self.event(node, finding, "simulated", now, fatal=True))
        elif self.local_nvml:
            probe = self.checker.probe(node)
            for finding in probe.drain_events():
                fatal = is_fatal(finding)
                if fatal:
                    stop_gpus[finding.gpu] = math.inf
                events.append(self.event(node, finding, "nvml", now, fatal=fatal))
        if lines and node.name not in self.pci:
            self.pci[node.name] = self.checker.probe(node).gpu_by_pci()
        for line in lines:
            event = self.kernel_event(node, line)
            event.fatal = event.fatal and line.at >= self.since_of(node.name)  # fatal: the runs on it were stopped
            if event.fatal:
                # A line written before this monitor started (missed in an outage) stops only the
                # runs that were running when it was written: a later run is not the fault's.
                until = math.inf if line.at >= self.started else line.at + KERNEL_GRACE
                stop_gpus[event.gpu] = max(stop_gpus.get(event.gpu, -math.inf), until)
            events.append(event)
        note = self.kernel_note(node)
        if note is not None and self.notes.get(node.name) != note:  # written when it changes, not every pass
            NodeHealth.objects.filter(node=node).exclude(kernel_log_note=note).update(kernel_log_note=note)
            self.notes[node.name] = note
        if stop_gpus:
            why = "; ".join(sorted({e.message or e.kind for e in carried + events if e.fatal}))[:300]
            self.stop_runs(node, stop_gpus, why)
        # ``new`` is asked once: an event kept back is stored at the next pass whatever it says.
        fresh = carried + [e for e in events if self.new(e)]
        events[:], carried[:] = fresh, []
        if fresh or self.cursors.to_save(node):  # a quiet pass makes no query, not even a savepoint
            with transaction.atomic():  # the events, and where the node's evidence was read to: both or neither
                if fresh:
                    HealthEvent.objects.bulk_create(fresh)
                self.cursors.save(node)
        events.clear()  # stored
        if stop_gpus or injected or fresh:
            # A reading now, and health derived from the events just stored (``record_health``):
            # a faulty GPU or node leaves placement at once.
            self.checker.check(node, news=True)
        if injected:
            self.checker.agent.wake()  # its reconcile reads the fault as applied: no more fault reads per pass
        return len(fresh)

    def kernel_note(self, node: Node) -> str | None:
        """Why the node's kernel log could not be read ("" when it could; None: not its to say)."""
        if node.simulated:
            return None
        return self.kernel.problem if self.kernel is not None else ""

    def event(self, node: Node, finding: Finding, source: str, at: datetime, *, fatal: bool) -> HealthEvent:
        return HealthEvent(
            node=node,
            at=at,
            kind=finding.kind,
            gpu=finding.gpu,
            xid=finding.xid,
            value=finding.value,
            expected=finding.expected,
            source=source,
            message=(finding.detail or finding.kind)[:500],
            fatal=fatal,
        )

    def kernel_event(self, node: Node, line: KernelLine) -> HealthEvent:
        at = datetime.fromtimestamp(line.at, tz=UTC)
        return kernel_line_event(node, line.text, at=at, source=line.source, gpu_by_pci=self.pci.get(node.name))

    def new(self, event: HealthEvent) -> bool:
        """Kernel lines are new by their cursor; a standing NVML condition (a lost GPU answers
        every wait with GPU_IS_LOST) is stored once per ``REPEAT_AFTER``."""
        if event.source in ("kmsg", "journalctl", "dmesg", "simulated"):
            return True
        key = (event.node_id, event.kind, event.gpu, event.xid, event.message)
        now = time.monotonic()
        if now - self.stored.get(key, -REPEAT_AFTER) < REPEAT_AFTER and event.kind != FindingKind.XID:
            return False
        self.stored[key] = now
        return True

    # --- stopping runs ----------------------------------------------------------------------
    def signal(self, part: AttemptNode, sig: int) -> bool:
        """As the agent signals its runs (on a cluster, through the scheduler)."""
        return self.checker.agent.signal(part, sig)

    def stop_runs(self, node: Node, gpus: Mapping[int | None, float], why: str) -> None:
        """SIGKILL every process of each run on ``gpus`` (None: the whole node) that started
        before the time each maps to (inf: whenever)."""
        parts = AttemptNode.objects.filter(node=node, runner_pid__gt=0, ended_at__isnull=True).select_related("attempt")
        for part in parts:
            until = max((at for gpu, at in gpus.items() if gpu is None or gpu in part.gpu_indices), default=None)
            began = part.attempt.started_at or part.attempt.created_at
            if until is None or began.timestamp() > until:
                continue
            if self.signal(part, signal.SIGKILL):
                logger.warning("job %s: fatal GPU event on %s (%s); its run was killed", part.attempt.job_id, node.name, why)
            # Kept even when the run has not recorded its processes yet: the kill is sent again
            # at every pass until the rank has ended (``escalate``).
            self.killed.setdefault(part.pk, (time.monotonic(), why))

    def escalate(self) -> None:
        """Runs killed for a fatal event whose supervisor still reports nothing: their processes
        are stuck in the driver (or escaped the run). The rank is reported ended, so the job
        fails over; its GPUs stay marked unhealthy."""
        for pk, (when, why) in list(self.killed.items()):
            part = AttemptNode.objects.filter(pk=pk).select_related("attempt", "attempt__job").first()
            if part is None or part.ended_at is not None:
                del self.killed[pk]
                continue
            if time.monotonic() - when < FATAL_EXIT_WAIT:
                self.signal(part, signal.SIGKILL)  # a process started since (or a run just launched)
                continue
            del self.killed[pk]
            fact = Ended(EndKind.HUNG_AFTER_KILL, exit_signal=signal.SIGKILL, detail=why)
            logger.warning("job %s: %s", part.attempt.job_id, describe(fact))
            for other in runs.part_exited(part, fact):
                if other.node.name in self.checker.agent.node_names:  # others' agents end theirs (stop request)
                    self.signal(other, signal.SIGTERM)


class NodeEvidenceMonitor(HealthMonitor):
    """The monitor of a cluster's nodes that are not this machine (Slurm's): each node's kernel
    lines are those the node's own health check handed over (``failover.nodecheck``, Slurm's
    ``HealthCheckProgram``: ``<node>.jsonl`` in ``directory``), never this machine's kernel log
    or NVML. Each file is read from where the last console stopped (``EvidenceCursor``), so what
    was written while none was reading is read once; from its start where it is another file
    (rotated) or shorter (truncated). Only a node no console ever read has history: the lines its
    file held from before the monitor started (a few seconds' grace aside) are not read."""

    def __init__(self, checker, *, directory: Path, interval: float | None = None) -> None:
        super().__init__(checker, interval=interval)
        self.directory = directory
        self.local_nvml = False
        self.cursors = Cursors(EvidenceCursor.Source.NODECHECK)
        self.offsets: dict[str, Position] = {}  # node → bytes of which file already read
        self.kept_back: dict[str, list[KernelLine]] = {}
        self.node_checks: dict[str, dict] = {}

    def kernel_lines(self, nodes: list[Node]) -> dict[str, list[KernelLine]]:
        if not self.load_cursors(nodes):
            return {}
        found: dict[str, list[KernelLine]] = {}
        for node in nodes:
            lines = self.kept_back.pop(node.name, []) + self.read_node(node.name)
            if lines:
                found[node.name] = lines
        return found

    def keep_back(self, node: Node, lines: list[KernelLine]) -> None:
        if lines:
            self.kept_back[node.name] = lines[-BACKLOG_KEPT:]

    def read_node(self, name: str) -> list[KernelLine]:
        paths = evidence_paths(self.directory, name)
        self.node_checks[name] = read_json_file(paths["status"]) or {}
        pci = self.node_checks[name].get("gpus_by_pci")
        if isinstance(pci, dict) and pci and all(isinstance(k, str) and type(v) is int for k, v in pci.items()):
            self.pci[name] = pci
        try:
            fd = os.open(paths["lines"], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:  # no fault line yet: the file the check makes later is read from its start
            if name not in self.offsets:
                self.offsets[name] = Position("", 0)
                self.cursors.advance(name, self.offsets[name])
            return []
        except OSError:
            return []
        with os.fdopen(fd, "rb") as fh:
            status = os.fstat(fh.fileno())
            size, file = status.st_size, file_identity(status)
            read = self.offsets.get(name) or self.cursors.saved.get(name)
            history = read is None  # no console has read the node: what its file holds is from before
            # Another file (rotated) or a shorter one (truncated): read from its start.
            offset = read.offset if read is not None and read.file == file and read.offset <= size else 0
            fh.seek(offset)
            data = fh.read(min(size - offset, EVIDENCE_READ_MAX))
        complete = data[: data.rfind(b"\n") + 1]
        self.offsets[name] = Position(file, offset + len(complete))
        self.cursors.advance(name, self.offsets[name])
        lines = []
        for raw in complete.splitlines():
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            at, text, seq = (record.get(k) for k in ("at", "text", "seq")) if isinstance(record, dict) else (None, None, None)
            if not isinstance(at, int | float) or isinstance(at, bool) or not isinstance(text, str):
                continue
            if history and at < self.started:
                continue  # from before any console watched the node: history
            lines.append(KernelLine(seq=seq if type(seq) is int else None, at=float(at), text=text[:RECORD_MAX_TEXT], source="kmsg"))
        if not history:
            self.missed(name, lines)
        return lines

    def kernel_note(self, node: Node) -> str | None:
        status = self.node_checks.get(node.name) or {}
        problem = status.get("problem")
        checked = status.get("checked_at")
        if not status:
            return "no health check from the node yet (Slurm's HealthCheckProgram: failover.nodecheck)"
        if isinstance(checked, int | float) and time.time() - checked > NODECHECK_STALE:
            return f"the node's health check last ran {int(time.time() - checked)} s ago"
        return problem[:300] if isinstance(problem, str) else ""


def kernel_line_event(node: Node, text: str, *, at: datetime, source: str, gpu_by_pci: dict[str, int] | None) -> HealthEvent:
    """The health event of one kernel-log line, parsed once (``failover.xids.parse_kernel_line``:
    only records whose message starts with the driver's text; a user process's trap or segfault
    record is none, whatever it quotes): an Xid names its GPU by bus id (domain kept), an SXid is the
    fabric's (node-wide); another hardware line (PCIe AER, a NIC link, thermal) names the GPU of the
    last PCI address in it that is one, else none. ``fatal`` is the line's own severity; a line the
    parser does not know is a ``kernel`` event, never fatal, kept on one line (``one_line``) so that
    no part of it is read later as a record of its own."""
    text = one_line(text)
    event = parse_kernel_line(text)
    if event is not None and event.kind in ("xid", "sxid"):
        gpu = (gpu_by_pci or {}).get(event.pci) if event.kind == "xid" else None
        kind = FindingKind.XID if event.kind == "xid" else FindingKind.SXID
        return HealthEvent(node=node, at=at, kind=kind, gpu=gpu, xid=event.code, source=source, message=text[:500], fatal=event.fatal)
    kind = event.kind if event is not None else "kernel"
    return HealthEvent(node=node, at=at, kind=kind, gpu=gpu_named(text, gpu_by_pci), nic=event.nic if event else "",
                       source=source, message=text[:500], fatal=event is not None and event.fatal)  # fmt: skip


def gpu_named(text: str, gpu_by_pci: dict[str, int] | None) -> int | None:
    """The GPU a kernel line names by PCI address, domain kept (the last one that is a GPU: an AER
    line names the port first, the device last); None for a node-wide line."""
    by_pci = gpu_by_pci or {}
    for address in reversed(_PCI.findall(text)):
        if (gpu := by_pci.get(bus_id(address))) is not None:
            return gpu
    return None


def prune_events(now: datetime | None = None) -> int:
    """Delete events older than ``HEALTH_EVENT_RETENTION`` seconds."""
    cutoff = (now or timezone.now()) - timedelta(seconds=settings.HEALTH_EVENT_RETENTION)
    deleted, _ = HealthEvent.objects.filter(at__lt=cutoff).delete()
    return deleted
