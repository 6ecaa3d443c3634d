"""Prometheus metrics at ``/metrics`` (operators, or a scraper with ``METRICS_TOKEN``).

Two kinds of metric, so every deployment reports the same numbers:
* **from the database, read at scrape time** (``DatabaseCollector``): jobs by status, failover
  judgements by verdict and cause, fault → Running latency, queue wait, checkpoint blocking and
  persist times, nodes and GPUs. The database is shared, so any console process answers alike.
  Notification deliveries by channel and state are read from the database too.
* **counted in the process** (prometheus_client's default registry): request latency
  (django-prometheus's middleware) and log lines ingested. With
  ``PROMETHEUS_MULTIPROC_DIR`` set, the web processes of a host share them (multiprocess mode);
  node agents and Celery workers serve their own on ``METRICS_PORT`` (see ``serve_process_metrics``).
"""

from __future__ import annotations

import hmac
import os
import time
from collections import Counter as Tally
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import Count, OuterRef, Q, Subquery, Sum
from django.db.models.fields.json import KeyTextTransform
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest, multiprocess, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from rest_framework import permissions, renderers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from failover.classify import HARDWARE, NON_HARDWARE
from jobs.models import GPU, JobAttempt, Node, ResourceSample, TrainingJob
from jobs.statuses import JobStatus
from logs.models import Checkpoint
from notify.models import Delivery

LATENCY_BUCKETS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800)
QUEUE_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 24 * 3600)
CHECKPOINT_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)


def histogram(name: str, doc: str, buckets: tuple[float, ...], values: list[float]) -> HistogramMetricFamily:
    counts = [sum(1 for v in values if v <= bound) for bound in buckets]
    family = HistogramMetricFamily(name, doc)
    family.add_metric([], [(repr(float(b)), c) for b, c in zip(buckets, counts, strict=True)] + [("+Inf", len(values))], sum(values))
    return family


def db_histogram(name: str, doc: str, buckets: tuple[float, ...], queryset, field: str) -> HistogramMetricFamily:
    """A histogram counted by the database: one query, one filtered count per bucket."""
    aggregates = {f"le{i}": Count("pk", filter=Q(**{f"{field}__lte": b})) for i, b in enumerate(buckets)}
    row = queryset.aggregate(total=Count("pk"), sum=Sum(field), **aggregates)
    family = HistogramMetricFamily(name, doc)
    points = [(repr(float(b)), row[f"le{i}"]) for i, b in enumerate(buckets)] + [("+Inf", row["total"])]
    family.add_metric([], points, float(row["sum"] or 0.0))
    return family


def seconds(later: datetime | None, earlier: datetime | None) -> float | None:
    if later is None or earlier is None:
        return None
    return max((later - earlier).total_seconds(), 0.0)


def outage_start(run_end: datetime | None, last_heartbeat) -> datetime | None:
    """When a failed-over run's outage began: its lost node's last heartbeat (unix time, stored by
    the lost-node sweep; the run was closed only a lease later), else the run's end."""
    try:
        return datetime.fromtimestamp(float(last_heartbeat), tz=UTC)
    except (TypeError, ValueError, OverflowError, OSError):
        return run_end


def failure_cause(verdict: str, evidence: dict) -> str:
    """A bounded label for what a judged run died of: xid_<n>, an NVML finding's kind, a log or
    kernel signature's name, or where the judgement came from (exit, heartbeat, none)."""
    evidence = evidence if isinstance(evidence, dict) else {}
    if evidence.get("xid"):
        return f"xid_{int(evidence['xid'])}"
    for key in ("kind", "signature", "source"):
        if evidence.get(key):
            return str(evidence[key])[:40]
    return "unknown"


class DatabaseCollector:
    """Reads the platform's state at scrape time (cached ``METRICS_CACHE_SECONDS``)."""

    def __init__(self) -> None:
        self.cached: tuple[float, list] | None = None

    def collect(self):
        now = time.monotonic()
        if self.cached is None or now - self.cached[0] > settings.METRICS_CACHE_SECONDS:
            self.cached = (now, list(self.families()))
        return iter(self.cached[1])

    def families(self):
        yield from self.job_families()
        yield from self.failover_families()
        yield db_histogram(
            "satrain_checkpoint_blocking_seconds",
            "Time training was blocked per committed ckptlib checkpoint",
            CHECKPOINT_BUCKETS,
            Checkpoint.objects.all(),
            "blocking_s",
        )
        yield db_histogram(
            "satrain_checkpoint_persist_seconds",
            "Time to persist a committed ckptlib checkpoint to storage",
            CHECKPOINT_BUCKETS,
            Checkpoint.objects.all(),
            "persist_s",
        )
        yield from self.node_families()
        yield from self.usage_families()
        yield from self.notification_families()

    def job_families(self):
        jobs = GaugeMetricFamily("satrain_jobs", "Training jobs by status", labels=["status"])
        counts = dict(TrainingJob.objects.values_list("status").annotate(n=Count("pk")).values_list("status", "n"))
        for status in JobStatus.values:
            jobs.add_metric([status], counts.get(status, 0))
        yield jobs
        first_starts = JobAttempt.objects.filter(number=1, started_at__isnull=False).values_list("started_at", "job__created_at")
        waits = [w for w in (seconds(start, created) for start, created in first_starts.iterator()) if w is not None]
        yield histogram("satrain_job_queue_wait_seconds", "From a job's creation to its first run starting", QUEUE_BUCKETS, waits)

    def failover_families(self):
        judged: Tally[tuple[str, str]] = Tally()
        for verdict, evidence in JobAttempt.objects.filter(verdict__in=[HARDWARE, NON_HARDWARE]).values_list("verdict", "evidence").iterator():
            judged[(verdict, failure_cause(verdict, evidence))] += 1
        family = CounterMetricFamily("satrain_failover_judgements", "Failed runs judged by Job Failover, by verdict and cause", labels=["verdict", "cause"])
        for (verdict, cause), count in sorted(judged.items()):
            family.add_metric([verdict, cause], count)
        yield family
        failovers = CounterMetricFamily("satrain_failovers", "Failovers counted (jobs re-placed after a hardware fault)")
        failovers.add_metric([], TrainingJob.objects.aggregate(n=Sum("failover_count"))["n"] or 0)
        yield failovers
        previous = JobAttempt.objects.filter(job=OuterRef("job"), number=OuterRef("number") - 1)
        resumed = (
            JobAttempt.objects.filter(number__gte=2, started_at__isnull=False)
            .annotate(
                prev_end=Subquery(previous.values("ended_at")[:1]),
                prev_verdict=Subquery(previous.values("verdict")[:1]),
                prev_beat=Subquery(previous.annotate(beat=KeyTextTransform("last_heartbeat", "evidence")).values("beat")[:1]),
            )
            .filter(prev_verdict=HARDWARE)
            .values_list("started_at", "prev_end", "prev_beat")
        )
        latencies = [s for s in (seconds(start, outage_start(end, beat)) for start, end, beat in resumed.iterator()) if s is not None]
        yield histogram(
            "satrain_failover_recovery_seconds",
            "From the outage's start (a lost node's last heartbeat, else the faulted run's end) to the job Running again",
            LATENCY_BUCKETS,
            latencies,
        )

    # A running job's latest usage sample (agent.sampling): GPU figures are the mean utilisation and
    # the summed memory and power of the job's GPUs, as the detail page's usage chart shows them.
    USAGE = (
        ("gpu_util", "satrain_job_gpu_utilization_percent", "Mean utilisation of a running job's GPUs, latest sample"),
        ("gpu_mem_mb", "satrain_job_gpu_memory_mib", "GPU memory a running job uses, summed over its GPUs, latest sample"),
        ("power_w", "satrain_job_gpu_power_watts", "Power a running job's GPUs draw, summed, latest sample"),
        ("cpu_percent", "satrain_job_cpu_percent", "Host CPU of a running job's processes (100 = one core), latest sample"),
        ("host_mem_mb", "satrain_job_host_memory_mib", "Resident host memory of a running job's processes, latest sample"),
    )

    def usage_families(self):
        latest = ResourceSample.objects.filter(job=OuterRef("pk")).order_by("-ts")
        running = (
            TrainingJob.objects.filter(status=JobStatus.RUNNING)
            .annotate(**{field: Subquery(latest.values(field)[:1]) for field, _, _ in self.USAGE})
            .values_list("pk", "name", "project__name", *(field for field, _, _ in self.USAGE))
        )
        families = [GaugeMetricFamily(name, doc, labels=["job", "name", "project"]) for _, name, doc in self.USAGE]
        for pk, name, project, *values in running:
            for family, value in zip(families, values, strict=True):
                if value is not None:
                    family.add_metric([str(pk), name, project or ""], value)
        yield from families

    def node_families(self):
        now = timezone.now()
        up = GaugeMetricFamily("satrain_node_healthy", "1 if the node is healthy", labels=["node", "state", "cordoned"])
        heartbeat = GaugeMetricFamily("satrain_node_heartbeat_age_seconds", "Seconds since the node's agent last reported", labels=["node"])
        for node in Node.objects.order_by("name"):
            up.add_metric([node.name, node.state, str(node.cordoned).lower()], 1 if node.healthy else 0)
            if node.last_heartbeat is not None:
                heartbeat.add_metric([node.name], seconds(now, node.last_heartbeat) or 0.0)
        yield up
        yield heartbeat
        gpus = GaugeMetricFamily("satrain_gpus", "GPUs by node, health and whether a job holds them", labels=["node", "healthy", "allocated"])
        rows = (
            GPU.objects.values_list("node__name", "healthy")
            .annotate(held=Count("pk", filter=Q(allocated_to__isnull=False)), n=Count("pk"))
            .values_list("node__name", "healthy", "held", "n")
        )
        for node_name, healthy, held, total in sorted(rows):
            gpus.add_metric([node_name, str(healthy).lower(), "true"], held)
            gpus.add_metric([node_name, str(healthy).lower(), "false"], total - held)
        yield gpus

    def notification_families(self):
        family = GaugeMetricFamily(
            "satrain_notification_deliveries", "Notification deliveries by channel and state, and tries made", labels=["channel", "state"]
        )
        tries = CounterMetricFamily("satrain_notification_tries", "Delivery tries made (first sends and retries)", labels=["channel"])
        rows = Delivery.objects.values_list("subscription__channel", "state").annotate(n=Count("pk"), tries=Sum("attempts"))
        per_channel: Tally[str] = Tally()
        for channel, state, n, made in rows.values_list("subscription__channel", "state", "n", "tries"):
            family.add_metric([channel, state], n)
            per_channel[channel] += made or 0
        for channel, made in sorted(per_channel.items()):
            tries.add_metric([channel], made)
        yield family
        yield tries


DATABASE_REGISTRY = CollectorRegistry(auto_describe=False)
DATABASE_REGISTRY.register(DatabaseCollector())


def process_registry():
    """The in-process metrics: all web processes' together in multiprocess mode."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return registry
    return REGISTRY


def exposition() -> bytes:
    return generate_latest(process_registry()) + generate_latest(DATABASE_REGISTRY)


class PrometheusText(renderers.BaseRenderer):
    media_type = "text/plain"
    format = "prometheus"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, bytes) else str(data.get("detail", data) if isinstance(data, dict) else data).encode()


class StaffOrMetricsToken(permissions.BasePermission):
    message = "Metrics are for operators: sign in as staff, or send Authorization: Bearer <METRICS_TOKEN>."

    def has_permission(self, request, view) -> bool:
        token = settings.METRICS_TOKEN
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if token and header.startswith("Bearer ") and _same(header[7:].strip(), token):
            return True
        return bool(request.user and request.user.is_authenticated and request.user.is_staff)


def _same(given: str, expected: str) -> bool:

    return hmac.compare_digest(given.encode(), expected.encode())


@extend_schema(exclude=True)  # Prometheus's text format, not part of the REST API
class MetricsView(APIView):
    permission_classes = [StaffOrMetricsToken]
    renderer_classes = [PrometheusText]

    def get_authenticators(self):
        # A bearer metrics token is not a user's token: leave it to the permission above.
        request = getattr(self, "request", None)
        if request is not None and request.META.get("HTTP_AUTHORIZATION", "").startswith("Bearer "):
            return []
        return super().get_authenticators()

    def get(self, request: Request) -> Response:
        return Response(exposition(), content_type="text/plain; version=0.0.4; charset=utf-8")


def serve_process_metrics(role: str) -> None:
    """Serve this process's own metrics on ``METRICS_PORT`` (node agents, Celery workers in
    scale-out). The database metrics are not repeated there: the console's /metrics has them."""
    if not settings.METRICS_PORT:
        return

    start_http_server(settings.METRICS_PORT, addr=settings.METRICS_ADDR)
