"""Health of nodes as the probes saw it, and faults injected into simulated GPUs."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class SimulatedFault(models.Model):
    """A fault an operator injected into a simulated GPU (or a whole simulated node).

    The simulated probe reports it through the same interface as NVML's readings; the node agent
    kills the training processes on that GPU as the real fault would.
    """

    class Kind(models.TextChoices):
        XID = "xid", "Xid error"
        ECC = "ecc", "Uncorrectable ECC error"
        GPU_LOST = "gpu_lost", "GPU lost (fallen off the bus)"
        NVLINK = "nvlink", "NVLink failure"
        THERMAL = "thermal", "Thermal shutdown"

    node = models.ForeignKey("jobs.Node", on_delete=models.CASCADE, related_name="simulated_faults")
    gpu = models.PositiveSmallIntegerField(null=True, blank=True, help_text="GPU index; empty for the whole node")
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.XID)
    xid = models.PositiveIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.CharField(max_length=150, blank=True)
    # When the node agent made the processes on the GPU die (None: not yet).
    applied_at = models.DateTimeField(null=True, blank=True)
    cleared_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        where = f"{self.node.name}/gpu{self.gpu}" if self.gpu is not None else self.node.name
        return f"{self.get_kind_display()} on {where}"


class NodeHealth(models.Model):
    """When and how a node was last read, and when an operator last cleared it.

    The evidence itself is the node's ``HealthEvent`` rows (one append-only store): a verdict
    counts the events within its attempt's time window, node health the events since
    ``cleared_at``.
    """

    node = models.OneToOneField("jobs.Node", on_delete=models.CASCADE, related_name="health")
    checked_at = models.DateTimeField(default=timezone.now)
    source = models.CharField(max_length=16, default="simulated")
    cleared_at = models.DateTimeField(null=True, blank=True)
    # Where the kernel log was read from, or why it could not be ("" while it reads /dev/kmsg).
    kernel_log_note = models.CharField(max_length=300, blank=True)

    class Meta:
        verbose_name_plural = "node health"

    def __str__(self) -> str:
        return f"{self.node.name}: read at {self.checked_at:%H:%M:%S} ({self.source})"


class HealthEvent(models.Model):
    """One thing a node's health monitor saw, when it happened: an Xid, a GPU lost, an ECC count,
    a kernel-log line (PCIe AER, NIC link down, thermal shutdown, the OOM killer), a window of
    hardware slowdown. Verdicts read the events on an attempt's GPUs within its time window;
    events older than ``HEALTH_EVENT_RETENTION`` are pruned."""

    node = models.ForeignKey("jobs.Node", on_delete=models.CASCADE, related_name="health_events")
    at = models.DateTimeField(default=timezone.now)
    kind = models.CharField(max_length=32)  # a FindingKind, or a kernel line's signature name
    gpu = models.PositiveSmallIntegerField(null=True, blank=True)
    nic = models.CharField(max_length=64, blank=True)
    xid = models.PositiveIntegerField(null=True, blank=True)
    value = models.BigIntegerField(null=True, blank=True)
    expected = models.BigIntegerField(null=True, blank=True)  # what ``value`` should be (GPUs visible, link width)
    source = models.CharField(max_length=16)  # nvml | simulated | kmsg | journalctl | dmesg | simulated-kmsg
    message = models.CharField(max_length=500, blank=True)
    fatal = models.BooleanField(default=False)  # the runs on its GPU were stopped at once

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["node", "at"])]

    def __str__(self) -> str:
        where = f"{self.node.name}/gpu{self.gpu}" if self.gpu is not None else self.node.name
        return f"{self.kind} on {where} at {self.at:%H:%M:%S}"


class EvidenceCursor(models.Model):
    """Where the console's health monitor stopped reading a node's kernel evidence, kept across
    restarts: a console started again reads exactly what was written while none was reading, once.

    ``source`` says which evidence: this machine's kernel log (``kernel``: ``position`` is the last
    ``/dev/kmsg`` sequence number read) or the file a cluster node's own health check writes
    (``nodecheck``: ``position`` is the bytes of it read). ``file`` names the file the position is
    in (device and inode, or the boot for ``/dev/kmsg``): a position in another file (rotated,
    rebooted) means nothing, and the new one is read from its start."""

    class Source(models.TextChoices):
        KERNEL = "kernel", "this machine's kernel log"
        NODECHECK = "nodecheck", "the node's own health check"

    node = models.ForeignKey("jobs.Node", on_delete=models.CASCADE, related_name="evidence_cursors")
    source = models.CharField(max_length=16, choices=Source.choices)
    file = models.CharField(max_length=64, blank=True)
    position = models.BigIntegerField(default=0)
    read_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "source"], name="evidence_cursor_one_per_source")]

    def __str__(self) -> str:
        return f"{self.node.name}: {self.source} read to {self.position} of {self.file or '?'}"
