"""The node agent: launches placed runs on its nodes, supervises them and reports back.

Each run is supervised by ``jobs.agent.runner`` in its own session, so the agent (and the
console it may live in) can restart at any time: on its next tick it finds every run of its
nodes again from the files the runner keeps, ingests the output lines it has not stored yet
(delivery is idempotent) and records the exits it missed.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from jobs import hooks
from jobs.agent import runtime
from jobs.models import AttemptNode, Image, JobAttempt, Node, TrainingJob
from jobs.services.lifecycle import transition
from jobs.services.placement import abandon_open_attempts, back_off_image_pull
from jobs.services.runs import AGENT, mark_running, record_exit
from jobs.statuses import WAITING, JobStatus
from logs.services import RawLine, ingest_lines

logger = logging.getLogger(__name__)

# A launched runner that has not written pid.json by then is taken as lost.
LAUNCH_TIMEOUT = timedelta(seconds=60)
INGEST_BATCH = 5000
# At most this much of one run's output per round, so one chatty run never starves the others,
# nor the heartbeat (which would get the node taken as lost).
DRAIN_MAX_BYTES = 4 << 20


def vendor_dir() -> str:
    return str(Path(settings.BASE_DIR) / "ckptlib" / "vendor")


def job_dir(job_id: int) -> Path:
    return Path(settings.JOB_WORK_ROOT) / str(job_id)


def run_dir(part: AttemptNode) -> Path:
    return job_dir(part.attempt.job_id) / f"attempt-{part.attempt.number}" / f"rank-{part.rank}"


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def latest_checkpoint_step(output_dir: str) -> int | None:
    """The step of the newest committed ckptlib checkpoint in a job's output directory."""
    from ckptlib import checkpoint_root, read_latest

    return read_latest(checkpoint_root(output_dir))


def signal_run(part: AttemptNode, sig: int) -> bool:
    """Signal a run's process group by its pid.json; False if it has not recorded its group yet."""
    pid_info = read_json(run_dir(part) / "pid.json")
    if not pid_info:
        return False
    try:
        os.killpg(int(pid_info["pgid"]), sig)
        logger.info("job %s: sent %s to attempt %s rank %s", part.attempt.job_id, signal.Signals(sig).name, part.attempt.number, part.rank)
    except ProcessLookupError:
        pass
    except PermissionError:
        logger.warning("job %s: not allowed to signal process group %s", part.attempt.job_id, pid_info["pgid"])
    return True


def runtime_python(runtime: str) -> Path:
    return Path(runtime) / "bin" / "python"


class NodeAgent:
    """Serves a set of nodes. ``tick()`` does one round of work; call it periodically."""

    def __init__(self, node_names: list[str], *, name: str = "embedded") -> None:
        self.node_names = list(node_names)
        self.name = name
        runtime.local_nodes.update(self.node_names)
        self.offsets: dict[int, int] = {}  # AttemptNode id → bytes of output.jsonl ingested
        self.children: dict[int, subprocess.Popen] = {}  # reaped here so no zombie lingers
        self.terminated: set[int] = set()  # AttemptNode ids sent SIGTERM by this agent
        self.last_heartbeat = None

    def stop_strays(self) -> None:
        """At start: end processes of parts the control plane closed while this agent was away
        (its node was taken as lost), so a job never runs twice; and deliver the output they
        wrote meanwhile, so no line is lost."""
        recent = timezone.now() - timedelta(days=7)
        # Closed without an exit seen by an agent: the sweeper ended them when the node was lost.
        parts = AttemptNode.objects.filter(
            node__name__in=self.node_names, ended_at__gte=recent, runner_pid__gt=0, exit_code__isnull=True, exit_signal__isnull=True
        ).select_related("attempt")
        for part in parts:
            directory = run_dir(part)
            if not (directory / "exit.json").exists() and signal_run(part, signal.SIGKILL):
                logger.warning("job %s: killed stray run of attempt %s", part.attempt.job_id, part.attempt.number)
            while not self.drain(part, directory):
                pass
            self.offsets.pop(part.pk, None)

    # --- one round -------------------------------------------------------------------------
    def tick(self) -> int:
        """One full round; returns how many runs were seen to end."""
        self.heartbeat()
        self.launch_placed()
        for hook in hooks.agent_round_hooks:
            hook(self)
        self.enforce_stops()
        ended = self.collect()
        for pid, child in list(self.children.items()):
            if child.poll() is not None:
                del self.children[pid]
        return ended

    def heartbeat(self) -> None:
        now = timezone.now()
        # Three beats per timeout, at most every 5 s: one late beat never makes a node lost.
        every = timedelta(seconds=min(5.0, settings.NODE_HEARTBEAT_TIMEOUT / 3))
        if self.last_heartbeat and now - self.last_heartbeat < every:
            return
        Node.objects.filter(name__in=self.node_names).update(last_heartbeat=now)
        self.last_heartbeat = now

    # --- launch ----------------------------------------------------------------------------
    def launch_placed(self) -> None:
        attempts = (
            JobAttempt.objects.filter(
                state=JobAttempt.State.PLACED, placements__node__name__in=self.node_names, placements__runner_pid__isnull=True
            )
            .select_related("job")
            .distinct()
            .order_by("created_at")
        )
        for attempt in attempts:
            self.launch(attempt)

    def launch(self, attempt: JobAttempt) -> None:
        """Start this agent's parts of a placed attempt; the last part started makes it Running.

        Each part is claimed by compare-and-swap first, so a duplicate dispatch or two agents
        never start it twice.
        """
        job = attempt.job
        if job.status not in (JobStatus.PENDING, JobStatus.IMAGE_PULL_BACKOFF, JobStatus.FAILOVER_IN_PROGRESS):
            abandon_open_attempts(job.pk, cause=f"job is {job.status}")
            return
        image = Image.objects.filter(reference=job.image).first()
        if image is None or not runtime_python(image.runtime).exists():
            why = f"image {job.image} is not registered" if image is None else (
                f"image {job.image} cannot be resolved on the node: {runtime_python(image.runtime)} does not exist"
            )
            abandon_open_attempts(job.pk, cause=why)
            back_off_image_pull(job, why)
            return
        mine = list(
            attempt.placements.filter(node__name__in=self.node_names, runner_pid__isnull=True).select_related("node").order_by("rank")
        )
        claimed = [p for p in mine if AttemptNode.objects.filter(pk=p.pk, runner_pid__isnull=True).update(runner_pid=0)]
        if not claimed:
            return
        output_dir = job.output_dir or str(job_dir(job.pk) / "output")
        if attempt.number > 1:
            attempt.resume_step = latest_checkpoint_step(output_dir)
            if claimed[0].rank == 0:
                JobAttempt.objects.filter(pk=attempt.pk).update(resume_step=attempt.resume_step)
        try:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            for part in claimed:
                self.start_runner(job, attempt, part, image.runtime, output_dir)
        except OSError as exc:
            logger.exception("job %s: launch failed", job.pk)
            abandon_open_attempts(job.pk, cause=f"launch failed: {exc}")
            transition(job.pk, JobStatus.FAILED, reason=f"could not start the run: {exc}", actor=AGENT, attempt=attempt.number)
            return
        if attempt.placements.filter(Q(runner_pid__isnull=True) | Q(runner_pid=0)).exists():
            return  # other agents still start their ranks
        attempt.refresh_from_db(fields=["resume_step"])
        if not mark_running(attempt):
            # The job was stopped while we launched: enforce_stops terminates what we started.
            logger.info("job %s: stopped during launch; terminating attempt %s", job.pk, attempt.number)

    def start_runner(self, job: TrainingJob, attempt: JobAttempt, part: AttemptNode, runtime: str, output_dir: str) -> None:
        directory = run_dir(part)
        directory.mkdir(parents=True, exist_ok=True)
        # Files of an earlier install reusing JOB_WORK_ROOT must not pass for this run's.
        for stale in ("pid.json", "exit.json", "output.jsonl"):
            (directory / stale).unlink(missing_ok=True)
        workdir = job_dir(job.pk) / "work"
        env = {
            "PATH": f"{runtime}/bin:{os.environ.get('PATH', '/usr/local/bin:/usr/bin:/bin')}",
            "HOME": os.environ.get("HOME", str(workdir)),
            "LANG": "C.UTF-8",
            "PYTHONUNBUFFERED": "1",
            "VIRTUAL_ENV": runtime,
            # torch allocates large CPU tensors page-aligned (and on huge pages), so ckptlib
            # writes them to disk straight from memory; a job's own env may turn it off.
            "THP_MEM_ALLOC_ENABLE": "1",
            **job.env,
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, part.gpu_indices)),
            "CHECKPOINT_VENDOR": vendor_dir(),
            "RANK": str(part.rank),
            "NODE_RANK": str(part.rank),
            "LOCAL_RANK": "0",
            "WORLD_SIZE": str(job.node_count),
            "MASTER_ADDR": attempt.master_addr,
            "MASTER_PORT": str(attempt.master_port),
            "JOB_NAME": job.name,
            "JOB_ID": str(job.pk),
            "JOB_ATTEMPT": str(attempt.number),
            "OUTPUT_DIR": output_dir,
        }
        if attempt.resume_step is not None:
            env["CKPT_LAST_STEP"] = str(attempt.resume_step)
        spec = {
            "command": job.command,
            "cwd": str(workdir),
            "env": env,
            "max_line_chars": settings.LOG_MAX_LINE_CHARS,
        }
        spec_path = directory / "spec.json"
        spec_path.write_text(json.dumps(spec))
        with open(directory / "runner.log", "ab") as err:
            child = subprocess.Popen(
                [sys.executable, "-m", "jobs.agent.runner", str(spec_path)],
                cwd=str(settings.BASE_DIR),
                stdin=subprocess.DEVNULL,
                stdout=err,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.children[child.pid] = child
        AttemptNode.objects.filter(pk=part.pk).update(runner_pid=child.pid, workdir=str(workdir))
        logger.info("job %s: attempt %s rank %s started on %s (runner %s)", job.pk, attempt.number, part.rank, part.node.name, child.pid)

    # --- stop ------------------------------------------------------------------------------
    def enforce_stops(self) -> None:
        now = timezone.now()
        grace = timedelta(seconds=settings.STOP_GRACE_PERIOD)
        # Max run time: ask the run to stop, with the reason.
        for job in TrainingJob.objects.filter(
            status=JobStatus.RUNNING, max_run_minutes__isnull=False, attempts__placements__node__name__in=self.node_names
        ).distinct():
            if job.started_at and now - job.started_at > timedelta(minutes=job.max_run_minutes):
                transition(
                    job.pk,
                    JobStatus.STOPPING,
                    reason=f"max run time of {job.max_run_minutes} min exceeded",
                    actor=AGENT,
                    expected={JobStatus.RUNNING},
                )
        for part in self.live_parts().select_related("attempt", "attempt__job"):
            attempt = part.attempt
            if attempt.job.status == JobStatus.RUNNING and attempt.stop_requested_at is None:
                continue
            if attempt.state == JobAttempt.State.PLACED and attempt.stop_requested_at is None and attempt.job.status in WAITING:
                continue  # still being launched (here or, for other ranks, by other agents): not Running yet
            if attempt.stop_requested_at is None:
                JobAttempt.objects.filter(pk=attempt.pk, stop_requested_at__isnull=True).update(stop_requested_at=now)
                attempt.stop_requested_at = now
            if part.pk not in self.terminated and signal_run(part, signal.SIGTERM):
                self.terminated.add(part.pk)
            if now - attempt.stop_requested_at >= grace:
                signal_run(part, signal.SIGKILL)

    def live_parts(self):
        """The parts of runs on our nodes that were started and have not been seen to end."""
        return AttemptNode.objects.filter(node__name__in=self.node_names, runner_pid__gt=0, ended_at__isnull=True)

    # --- output and exits ------------------------------------------------------------------
    def collect(self) -> int:
        """Ingest new output of every live run and record the runs that ended; returns how many."""
        ended = 0
        for part in self.live_parts().select_related("attempt", "node"):
            directory = run_dir(part)
            exit_info = read_json(directory / "exit.json")  # read first: once it exists, output is whole
            drained = self.drain(part, directory)
            self.heartbeat()
            if exit_info is not None:
                if drained:
                    self.part_ended(part, exit_info.get("exit_code"), exit_info.get("signal"), "")
                    ended += 1
            elif not self.runner_alive(part, directory):
                self.part_ended(part, None, None, "the run's supervisor process was lost")
                ended += 1
        return ended

    def drain(self, part: AttemptNode, directory: Path) -> bool:
        """Ingest the run's next output lines; True once everything written so far is stored."""
        path = directory / "output.jsonl"
        offset = self.offsets.get(part.pk, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read(DRAIN_MAX_BYTES)
                at_end = len(chunk) < DRAIN_MAX_BYTES or not fh.read(1)
        except FileNotFoundError:
            return True
        end = chunk.rfind(b"\n")
        if end < 0:
            return at_end
        records = chunk[: end + 1].splitlines()
        try:
            # One parse for the whole slice; the runner writes one JSON object per line.
            parsed = json.loads(b"[" + b",".join(records) + b"]")
        except ValueError:
            parsed = [self.parse_record(raw, part) for raw in records]
        lines = []
        for rec in parsed:
            if rec is None:
                continue
            try:
                lines.append(RawLine(int(rec["n"]), datetime.fromtimestamp(rec["t"], tz=UTC), str(rec["s"])))
            except (ValueError, KeyError, TypeError):
                logger.warning("job %s: skipped an unreadable output record", part.attempt.job_id)
        for start in range(0, len(lines), INGEST_BATCH):
            ingest_lines(job_id=part.attempt.job_id, stream=part.stream, attempt=part.attempt.number, lines=lines[start : start + INGEST_BATCH])
        self.offsets[part.pk] = offset + end + 1
        return at_end and end + 1 == len(chunk)

    @staticmethod
    def parse_record(raw: bytes, part: AttemptNode) -> dict | None:
        try:
            return json.loads(raw)
        except ValueError:
            logger.warning("job %s: skipped an unreadable output record", part.attempt.job_id)
            return None

    def runner_alive(self, part: AttemptNode, directory: Path) -> bool:
        pid = part.runner_pid
        if pid is None:
            return False
        try:
            proc = psutil.Process(pid)
            alive = proc.status() != psutil.STATUS_ZOMBIE and "jobs.agent.runner" in " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            alive = False
        if alive:
            return True
        # The runner may have finished between our reads: trust exit.json if it is there now.
        if (directory / "exit.json").exists():
            return True
        started = part.attempt.started_at or part.attempt.created_at
        return not (directory / "pid.json").exists() and timezone.now() - started < LAUNCH_TIMEOUT and pid in self.children

    def part_ended(self, part: AttemptNode, exit_code: int | None, exit_signal: int | None, cause: str) -> None:
        now = timezone.now()
        AttemptNode.objects.filter(pk=part.pk, ended_at__isnull=True).update(ended_at=now, exit_code=exit_code, exit_signal=exit_signal)
        self.offsets.pop(part.pk, None)
        self.terminated.discard(part.pk)
        attempt = part.attempt
        failed = cause or exit_signal or (exit_code not in (0, None))
        siblings = AttemptNode.objects.filter(attempt=attempt)
        if siblings.filter(ended_at__isnull=True).exists():
            if failed and attempt.stop_requested_at is None:
                # One rank failed: the others cannot go on without it.
                JobAttempt.objects.filter(pk=attempt.pk, stop_requested_at__isnull=True).update(stop_requested_at=now)
                for other in siblings.filter(ended_at__isnull=True).select_related("attempt"):
                    signal_run(other, signal.SIGTERM)
            return
        # The attempt's outcome: the first rank that failed, else rank 0's.
        ended = list(siblings.order_by("ended_at", "rank"))
        first_bad = next((p for p in ended if p.exit_signal or p.exit_code not in (0,)), None)
        source = first_bad or ended[0]
        record_exit(attempt, exit_code=source.exit_code, exit_signal=source.exit_signal, cause=cause)
