"""Read one failover's timeline back from the database's own timestamps."""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime

from agent import runfiles

STEP_RE = re.compile(r"^step (\d+)/\d+")


def ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def diff(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None:
        return None
    return later - earlier


@dataclass
class Failover:
    """One injected fault and the failover it caused; absolute times are Unix seconds."""

    job_id: int
    old_attempt: int
    node_from: str
    gpu: int
    fault_created: float | None = None  # inject_fault() wrote the row
    fault_applied: float | None = None  # the agent killed the run's process group
    old_ended: float | None = None  # the agent saw the run end (attempt ended_at)
    failover_event: float | None = None  # Running → Pending - failoverinprogress
    judged: float | None = None  # the verdict was stored
    verdict: str = ""
    new_attempt: int | None = None
    node_to: str = ""
    new_created: float | None = None  # placement created the next attempt
    runner_up: float | None = None  # the runner started the command (pid.json)
    new_started: float | None = None  # attempt started_at (job marked Running)
    running_event: float | None = None  # the Running event row
    first_line_ts: float | None = None  # LogLine.ts: when the runner read the first new line
    first_line_seen: float | None = None  # when the bench first found that line in the database
    running_seen: float | None = None  # when the bench first saw the job Running again
    resume_step: int | None = None
    extra: dict = field(default_factory=dict)

    # --- phases (seconds) --------------------------------------------------------------------
    def phases(self) -> dict[str, float | None]:
        return {
            "inject→applied (agent round picks the fault up)": diff(self.fault_applied, self.fault_created),
            "detection (process died → attempt ended)": diff(self.old_ended, self.fault_applied),
            "decision (ended → verdict stored)": diff(self.judged, self.old_ended),
            "placement (verdict → next attempt placed)": diff(self.new_created, self.judged),
            "launch (placed → Running)": diff(self.running_event, self.new_created),
            "process start (Running → first line ts)": diff(self.first_line_ts, self.running_event),
            "  of which runner up (Running → command spawned)": diff(self.runner_up, self.running_event),
            "  of which command (spawned → first line ts)": diff(self.first_line_ts, self.runner_up),
            "ingestion (line ts → stored, seen)": diff(self.first_line_seen, self.first_line_ts),
            "fault → attempt ended": diff(self.old_ended, self.fault_created),
            **(
                {"detection from a process that died itself (kill → ended)": diff(self.old_ended, self.extra["killed_at"])} if "killed_at" in self.extra else {}
            ),
            "TOTAL fault → Running": diff(self.running_event, self.fault_created),
            "TOTAL fault → first new line (ts)": diff(self.first_line_ts, self.fault_created),
            "TOTAL fault → first new line stored": diff(self.first_line_seen, self.fault_created),
        }

    def to_dict(self) -> dict:
        return {**asdict(self), "phases": self.phases()}


def read_back(fo: Failover, fault_id: int) -> Failover:
    """Fill ``fo`` from the database once the next attempt runs and has printed a line."""
    from django.conf import settings

    from failover.models import SimulatedFault
    from jobs.models import JobAttempt, JobEvent
    from jobs.statuses import JobStatus
    from logs.models import LogLine

    fault = SimulatedFault.objects.get(pk=fault_id)
    fo.fault_created, fo.fault_applied = ts(fault.created_at), ts(fault.applied_at)
    old = JobAttempt.objects.get(job_id=fo.job_id, number=fo.old_attempt)
    fo.old_ended, fo.judged, fo.verdict = ts(old.ended_at), ts(old.judged_at), old.verdict
    fo.failover_event = ts(
        JobEvent.objects.filter(job_id=fo.job_id, attempt=fo.old_attempt, to_status=JobStatus.FAILOVER_IN_PROGRESS).values_list("created_at", flat=True).first()
    )
    new = JobAttempt.objects.filter(job_id=fo.job_id, number__gt=fo.old_attempt).order_by("number").first()
    if new is None:
        return fo
    fo.new_attempt = new.number
    fo.new_created, fo.new_started, fo.resume_step = ts(new.created_at), ts(new.started_at), new.resume_step
    part = new.placements.select_related("node").first()
    if part is not None:
        fo.node_to = part.node.name
        pid_file = settings.JOB_WORK_ROOT / str(fo.job_id) / f"attempt-{new.number}" / f"rank-{part.rank}" / runfiles.PID_FILE
        with contextlib.suppress(OSError, ValueError, KeyError):
            fo.runner_up = float(json.loads(pid_file.read_text())["started_at"])
    fo.running_event = ts(
        JobEvent.objects.filter(job_id=fo.job_id, attempt=new.number, to_status=JobStatus.RUNNING).values_list("created_at", flat=True).first()
    )
    first = LogLine.objects.filter(job_id=fo.job_id, attempt=new.number).order_by("seq").values_list("ts", flat=True).first()
    fo.first_line_ts = ts(first)
    return fo


def wait_for(predicate, *, timeout: float, poll: float = 0.02, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy; return it, or raise TimeoutError."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(poll)


def watch_failover(job_id: int, old_attempt: int, *, timeout: float) -> tuple[float, float, int]:
    """After a fault: poll until a later attempt is Running and its first line is stored.

    Returns (when the bench saw it Running, when it saw the first new line, the attempt number).
    """
    from jobs.models import JobAttempt, TrainingJob
    from jobs.statuses import JobStatus
    from logs.models import LogLine

    running_seen = line_seen = None
    number = None
    deadline = time.monotonic() + timeout
    while running_seen is None or line_seen is None:
        now = time.time()
        if number is None:
            number = JobAttempt.objects.filter(job_id=job_id, number__gt=old_attempt).order_by("number").values_list("number", flat=True).first()
        if number is not None:
            if (
                running_seen is None
                and TrainingJob.objects.filter(pk=job_id, status=JobStatus.RUNNING).exists()
                and JobAttempt.objects.filter(job_id=job_id, number=number, state__in=[JobAttempt.State.RUNNING, JobAttempt.State.EXITED]).exists()
            ):
                running_seen = now
            if line_seen is None and LogLine.objects.filter(job_id=job_id, attempt=number).exists():
                line_seen = now
        if running_seen is None or line_seen is None:
            if time.monotonic() > deadline:
                status = TrainingJob.objects.values_list("status", "status_reason").get(pk=job_id)
                raise TimeoutError(f"job {job_id} did not fail over within {timeout:.0f}s (now {status[0]}: {status[1]})")
            time.sleep(0.01)
    return running_seen, line_seen, number


def last_step(job_id: int, *, attempt: int | None = None, until: float | None = None) -> tuple[int, float] | None:
    """The step number of the last ``step N/M`` line (by seq), and its ts."""
    from datetime import UTC

    from logs.models import LogLine

    rows = LogLine.objects.filter(job_id=job_id, text__startswith="step ")
    if attempt is not None:
        rows = rows.filter(attempt=attempt)
    if until is not None:
        rows = rows.filter(ts__lte=datetime.fromtimestamp(until, tz=UTC))
    row = rows.order_by("-seq").values_list("text", "ts").first()
    if row is None:
        return None
    match = STEP_RE.match(row[0])
    return (int(match.group(1)), row[1].timestamp()) if match else None


def first_step(job_id: int, *, attempt: int) -> tuple[int, float] | None:
    from logs.models import LogLine

    row = LogLine.objects.filter(job_id=job_id, attempt=attempt, text__startswith="step ").order_by("seq").values_list("text", "ts").first()
    if row is None:
        return None
    match = STEP_RE.match(row[0])
    return (int(match.group(1)), row[1].timestamp()) if match else None
