"""Checkpointless failover: every step's state off the node, in memory (docs/failover.md).

A run of a job with ``checkpointless`` on (and ``CHECKPOINTLESS`` on) gets a memory-backed
directory of its own (``SNAPSHOT_ROOT``, tmpfs: its pages count in the run's memory cgroup),
``/job/snapshot`` in its container, named by ``CKPT_SNAPSHOT_DIR``: ckptlib snapshots the state
there as often as every step, each rank alone (``rank-<r>/concurrent_checkpoint/checkpoint-<step>``,
committed in ckptlib's format, the newest two kept).

The agent that runs it (``Replicator``, a plug-in thread) sees each newer committed snapshot,
reads it through descriptors (no link followed: the directory is the job's), packs it into one
archive and sends it to the agent of another node (``agent.replicas``: signed, held in memory,
``REPLICAS_KEPT`` per rank), then records where (``agent.models.Replica``: step, holder, size,
SHA-256). The holder drops a job's replicas once the job has ended.

A re-placed attempt (``choose``) resumes from the newest of its disk checkpoint and the newest
step every rank has a replica of: its agent fetches its ranks' archives, checks size and SHA-256
against the record, unpacks them into the job's inputs directory (``/job/inputs/replica``,
read-only) and checks each as ckptlib checks a checkpoint (sizes, sampled checksums). Anything
missing or wrong: the disk checkpoint, and the attempt says why. The first agent to decide
records the choice on the attempt; the others follow it (every rank resumes from one step).
"""

from __future__ import annotations

import functools
import io
import logging
import os
import shlex
import shutil
import stat
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db import close_old_connections
from django.db.models import Count

from agent import inputs, replicas, uids, workdirs
from agent.models import Replica, ReplicaEndpoint
from ckptlib import CHECKPOINT_SUBDIR
from ckptlib._layout import CHECKPOINT_PREFIX, LATEST_MAX_BYTES, LATEST_NAME, checkpoint_problem, read_small_file
from jobs.backends.facts import LocalKernel
from jobs.models import AttemptNode, JobAttempt, Node, TrainingJob
from jobs.services import runs
from jobs.statuses import ACTIVE
from logs.models import JobProgress

logger = logging.getLogger(__name__)

SNAPSHOT_IN_RUN = "/job/snapshot"
REPLICA = "replica"  # below the job's inputs directory
MAX_ENTRIES = 1_000  # in one snapshot (ckptlib writes a handful per rank)
SWEEP_EVERY_S = 5.0
HOLDER_RECHECK_S = 5.0  # how long a rank's holder is taken as still the right one
IDLE_POLL_S = 0.25


class ReplicaRefused(OSError):
    """A replica cannot be resumed from; the message says why."""


def enabled(job: TrainingJob) -> bool:
    return bool(settings.CHECKPOINTLESS and job.checkpointless)


# --- the run's snapshot directory ------------------------------------------------------------------
def snapshot_root() -> Path:
    """This console's directory below ``SNAPSHOT_ROOT`` (the agent's own: refused otherwise);
    checked once per setting (the replication thread asks at every poll)."""
    return _snapshot_root(str(settings.SNAPSHOT_ROOT), str(settings.VAR_DIR))


@functools.lru_cache(maxsize=8)
def _snapshot_root(base_name: str, var_dir: str) -> Path:
    base = Path(base_name)
    base.mkdir(mode=0o755, parents=True, exist_ok=True)
    info = base.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise workdirs.DirectoryRefused(f"{base} is not a directory of the agent's own")
    return base / uids.install_id(Path(var_dir))


def snapshot_parts(job_id: int, attempt_number: int, rank: int) -> list[str]:
    return [str(job_id), f"attempt-{attempt_number}", f"rank-{rank}"]


def make_snapshot_dir(part: AttemptNode, uid: int | None) -> Path:
    attempt = part.attempt
    made = workdirs.make_leaf(snapshot_root(), snapshot_parts(attempt.job_id, attempt.number, part.rank), uid=uid)
    _prepared.add((attempt.job_id, attempt.number, part.rank))
    return made


def run_snapshot(job: TrainingJob, part: AttemptNode, uid: int | None, *, contained: bool) -> tuple[dict[str, str], list[str] | None]:
    """The run's snapshot environment and, in a container, its mount ([host, inside, "rw"]); nothing
    when the job has it off or no directory can be made (the run goes on, as before)."""
    if not enabled(job):
        return {}, None
    try:
        host = make_snapshot_dir(part, uid)
    except OSError as exc:
        logger.warning("job %s: no snapshot directory for rank %s (%s); it fails over from disk only", job.pk, part.rank, exc)
        return {}, None
    env = {"CKPT_SNAPSHOT_DIR": SNAPSHOT_IN_RUN if contained else str(host)}
    return env, ([str(host), SNAPSHOT_IN_RUN, "rw"] if contained else None)


def remove_snapshot_dirs(job_id: int) -> None:
    """Free an ended job's snapshot memory on this node."""
    try:
        shutil.rmtree(snapshot_root() / str(job_id), ignore_errors=True)
    except OSError:
        return


# --- shipping ------------------------------------------------------------------------------------
def pack(directory_fd: int, name: str) -> bytes:
    """``name`` (a committed snapshot) and what is in it as one uncompressed tar, read through
    descriptors, regular files and directories only (``agent.inputs.whole_tree``)."""
    buffer = io.BytesIO()
    top = os.open(name, workdirs.DIR_FLAGS, dir_fd=directory_fd)
    try:
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
            for entry, handle in inputs.whole_tree(top, f"{name}/", MAX_ENTRIES, "snapshot"):
                info = tarfile.TarInfo(entry.path)
                if handle is None:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    archive.addfile(info)
                    continue
                info.size, info.mode = os.fstat(handle).st_size, 0o644
                with os.fdopen(os.dup(handle), "rb") as reader:
                    archive.addfile(info, reader)
    finally:
        os.close(top)
    return buffer.getvalue()


def holder_for(part: AttemptNode, exclude: set[str]) -> tuple[Node, str] | None:
    """Where the rank's replica goes: the node that holds it already, else a Ready node with a
    replica endpoint that runs none of the attempt's ranks, the same for one job and rank."""
    current = Replica.objects.filter(job_id=part.attempt.job_id, rank=part.rank).select_related("holder").order_by("-step").first()
    endpoints = {
        e.node.name: (e.node, e.address)
        for e in ReplicaEndpoint.objects.select_related("node").filter(node__state=Node.State.READY).exclude(node__name__in=exclude)
    }
    if current is not None and current.holder.name in endpoints:
        return endpoints[current.holder.name]
    if not endpoints:
        return None
    names = sorted(endpoints)
    return endpoints[names[(part.attempt.job_id + part.rank) % len(names)]]


@dataclass
class Shipped:
    """What went out last for one rank: its step, the steps still held, where they go."""

    step: int = -1
    failed_at: float = 0.0
    due: float = 0.0  # not looked at again before (monotonic): a slow pack waits its share
    kept: list[int] = field(default_factory=list)
    holder: tuple[Node, str] | None = None
    holder_until: float = 0.0
    run: tuple[int, int, int] | None = None  # (job, attempt number, rank): its snapshot directory


_prepared: set[tuple[int, int, int]] = set()  # (job, attempt number, rank) given a snapshot directory here


class Replicator:
    """An agent plug-in: registers the agent with this process's one replication thread
    (``Hub``), which ships the newest snapshot of each live run of its agents to another node's
    agent and drops what this process holds of jobs that have ended."""

    def __init__(self, agent) -> None:
        self.agent = agent

    def on_start(self) -> None:
        # Only where the agent's runs are this machine's processes (its kernel log is theirs): a
        # cluster's scheduler runs the ranks elsewhere (Slurm), beside no agent (docs/failover.md).
        if settings.CHECKPOINTLESS and isinstance(self.agent.evidence_source(), LocalKernel):
            _hub.add(self.agent)

    def on_shutdown(self) -> None:
        _hub.discard(self.agent)

    def on_round(self) -> None:
        return None


class Hub:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.agents: list = []
        self.thread: threading.Thread | None = None
        self.stopped = threading.Event()
        self.store: replicas.ReplicaStore | None = None
        self.shipped: dict[int, Shipped] = {}  # AttemptNode id → what went out last
        self.failures: dict[int, str] = {}
        self.next_sweep = 0.0

    def add(self, agent) -> None:
        self.store, address = replicas.serve()
        for node in Node.objects.filter(name__in=list(agent.node_names)):
            ReplicaEndpoint.objects.update_or_create(node=node, defaults={"address": address})
        with self.lock:
            self.agents.append(agent)
            if self.thread is None or not self.thread.is_alive():
                self.stopped.clear()
                self.thread = threading.Thread(target=self.run, name="replicator", daemon=True)
                self.thread.start()

    def discard(self, agent) -> None:
        with self.lock:
            if agent in self.agents:
                self.agents.remove(agent)
            if not self.agents:
                self.stopped.set()

    def run(self) -> None:
        idle = False
        # Every REPLICA_POLL_INTERVAL while runs snapshot here; a quarter second while none does.
        while not self.stopped.wait(IDLE_POLL_S if idle else settings.REPLICA_POLL_INTERVAL):
            try:
                idle = not self.ship_all()
                if time.monotonic() >= self.next_sweep:
                    self.next_sweep = time.monotonic() + SWEEP_EVERY_S
                    self.sweep()
            except Exception:
                logger.exception("replication round failed")
                close_old_connections()
                self.stopped.wait(1.0)
        close_old_connections()

    def ship_all(self) -> bool:
        """Ship what is new of every live run that snapshots here; whether there is any."""
        with self.lock:
            agents = list(self.agents)
        live = [p for agent in agents for p in agent.live_parts() if (p.attempt.job_id, p.attempt.number, p.rank) in _prepared]
        for gone in set(self.shipped) - {p.pk for p in live}:
            ended = self.shipped.pop(gone)
            if ended.run is not None:  # the run is over: its snapshots' memory goes back
                _prepared.discard(ended.run)
                shutil.rmtree(snapshot_root().joinpath(*snapshot_parts(*ended.run)), ignore_errors=True)
        for part in live:
            self.ship(part)
        return bool(live)

    def ship(self, part: AttemptNode) -> None:
        """Ship the rank's newest committed snapshot if it is newer than the last one shipped:
        the ``latest`` marker first (one small read), then that snapshot checked and packed."""
        attempt = part.attempt
        last = self.shipped.setdefault(part.pk, Shipped(run=(attempt.job_id, attempt.number, part.rank)))
        began = time.monotonic()
        if began - last.failed_at < 1.0 or began < last.due:
            return
        # The run's directory is the job's: opened from the agent's root down, no link followed.
        names = (*snapshot_parts(attempt.job_id, attempt.number, part.rank), f"rank-{part.rank}", CHECKPOINT_SUBDIR)
        opened = workdirs.read_beneath(snapshot_root(), names)
        if opened is None:
            return
        try:
            root = int(opened.rsplit("/", 1)[1])
            step = int(read_small_file(LATEST_NAME, LATEST_MAX_BYTES, dir_fd=root).decode("ascii").strip())
            if step <= last.step:
                return
            name = f"{CHECKPOINT_PREFIX}{step}"
            problem = checkpoint_problem(root, name)
            if problem:
                logger.debug("job %s rank %s: snapshot %s not shipped: %s", attempt.job_id, part.rank, step, problem)
                return
            data = pack(root, name)
            # One run's big or many-file snapshot never takes the thread from the others' for long.
            last.due = time.monotonic() + min(1.0, 3 * (time.monotonic() - began))
        except (OSError, ValueError) as exc:  # no marker yet, or rotated away while read: the next one
            logger.debug("job %s rank %s: snapshot not packed: %s", attempt.job_id, part.rank, exc)
            return
        finally:
            workdirs.close_beneath(opened)
        if last.holder is None or time.monotonic() >= last.holder_until:
            ranks_nodes = set(AttemptNode.objects.filter(attempt_id=attempt.pk).values_list("node__name", flat=True))
            last.holder, last.holder_until = holder_for(part, ranks_nodes), time.monotonic() + HOLDER_RECHECK_S
        if last.holder is None:
            self.note_failure(part, "no other Ready node takes replicas")
            return
        node, address = last.holder
        # The newest REPLICAS_KEPT of the rank, and (several ranks) every one from the newest step all ranks have.
        keep_from = min(sorted([*last.kept, step])[-settings.REPLICAS_KEPT :])
        if attempt.job.node_count > 1:
            keep_from = min(keep_from, newest_whole_step(attempt.job) or 0)
        try:
            replicas.push(address, attempt.job_id, part.rank, step, data, limit=memory_limit_bytes(attempt.job), keep_from=keep_from)
        except replicas.ReplicaUnavailable as exc:
            last.failed_at, last.holder = time.monotonic(), None
            self.note_failure(part, f"{node.name}: {exc}")
            return
        row = Replica(job_id=attempt.job_id, attempt_id=attempt.pk, rank=part.rank, step=step, holder=node, size=len(data), sha256=replicas.digest(data))
        Replica.objects.bulk_create(
            [row], update_conflicts=True, unique_fields=["job", "rank", "step"], update_fields=["attempt", "holder", "size", "sha256", "updated_at"]
        )
        last.kept = replicas.within_cap([s for s in [*last.kept, step] if s >= keep_from])
        Replica.objects.filter(job_id=attempt.job_id, rank=part.rank).exclude(step__in=last.kept).delete()
        last.step, last.failed_at = step, 0.0
        self.failures.pop(part.pk, None)

    def note_failure(self, part: AttemptNode, why: str) -> None:
        if self.failures.get(part.pk) != why:
            self.failures[part.pk] = why
            logger.warning("job %s rank %s: snapshot not replicated: %s", part.attempt.job_id, part.rank, why)

    def sweep(self) -> None:
        """Drop what this process holds of ended jobs, with their records and snapshot memory."""
        if self.store is None:
            return
        held = self.store.jobs()
        ended = set(TrainingJob.objects.filter(pk__in=held).exclude(status__in=active_statuses()).values_list("pk", flat=True))
        ended |= held - set(TrainingJob.objects.filter(pk__in=held).values_list("pk", flat=True))
        for job in ended:
            freed = self.store.drop_job(job)
            Replica.objects.filter(job_id=job).delete()
            logger.info("job %s ended: its replicas here (%d bytes) dropped", job, freed)
        for job in TrainingJob.objects.filter(pk__in=local_snapshot_jobs()).exclude(status__in=active_statuses()).values_list("pk", flat=True):
            remove_snapshot_dirs(job)


def memory_limit_bytes(job: TrainingJob) -> int:
    """What the job's replicas may hold on their node: its memory limit per node (the default when unset)."""
    return (job.memory_limit_mb or settings.JOB_DEFAULT_MEMORY_MB or 16384) << 20


def active_statuses() -> list[str]:
    return list(ACTIVE)


_hub = Hub()


def local_snapshot_jobs() -> list[int]:
    try:
        root = snapshot_root()
    except OSError:
        return []
    return [int(p.name) for p in root.iterdir() if p.name.isdigit()] if root.is_dir() else []


# --- resuming ---------------------------------------------------------------------------------------
@dataclass
class Resume:
    """What a re-placed attempt resumes from: ``step`` (None: the start), ``source`` ("disk",
    "replica"; "" from the start), why (``detail``) and, from a replica, ``CKPT_RESUME_ROOT``."""

    step: int | None
    source: str
    detail: str = ""
    env: dict[str, str] = field(default_factory=dict)
    setup: list[str] = field(default_factory=list)


def complete_step(job: TrainingJob) -> tuple[int | None, list[Replica]]:
    """The newest step every rank of the job has a replica of (``newest_whole_step``), and those replicas by rank."""
    step = newest_whole_step(job)
    if step is None:
        return None, []
    rows = {row.rank: row for row in Replica.objects.filter(job=job, step=step).select_related("holder")}
    return step, [rows[r] for r in range(job.node_count)]


def newest_whole_step(job: TrainingJob) -> int | None:
    """The newest step every rank of the job has a replica of: a rank's older replicas are kept
    down to it (one rank's run may go on snapshotting for a while after another's node failed)."""
    found = (
        Replica.objects.filter(job=job)
        .values("step")
        .annotate(ranks=Count("rank"))
        .filter(ranks__gte=job.node_count)
        .order_by("-step")
        .values_list("step", flat=True)
        .first()
    )
    return found


def reached_step(job: TrainingJob) -> int | None:
    return JobProgress.objects.filter(job=job).values_list("step", flat=True).first()


def stage_replica(job: TrainingJob, row: Replica, inputs_dir: Path) -> None:
    """Fetch ``row``'s archive from its holder, check it against the record, unpack it into
    ``inputs_dir/replica/rank-<r>/concurrent_checkpoint`` and check it as ckptlib does."""
    endpoint = ReplicaEndpoint.objects.filter(node_id=row.holder_id).values_list("address", flat=True).first()
    if endpoint is None:
        raise ReplicaRefused(f"{row.holder.name} takes no replicas any more")
    try:
        data = replicas.fetch(endpoint, job.pk, row.rank, row.step)
    except replicas.ReplicaUnavailable as exc:
        raise ReplicaRefused(f"{row.holder.name} did not give it: {exc}") from None
    if len(data) != row.size:
        raise ReplicaRefused(f"rank {row.rank}'s replica is {len(data)} bytes, {row.size} were sent")
    if replicas.digest(data) != row.sha256:
        raise ReplicaRefused(f"rank {row.rank}'s replica does not match the checksum it was sent with")
    base = inputs.fresh_child(workdirs.make_readable(inputs_dir, [REPLICA]), f"rank-{row.rank}") / CHECKPOINT_SUBDIR
    base.mkdir(mode=0o755)
    name = f"{CHECKPOINT_PREFIX}{row.step}"
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            if any(not m.name.startswith(f"{name}/") and m.name != name for m in archive.getmembers()):
                raise ReplicaRefused(f"rank {row.rank}'s replica holds entries outside {name}")
            archive.extractall(base, filter="data")
    except (tarfile.TarError, OSError) as exc:
        raise ReplicaRefused(f"rank {row.rank}'s replica could not be unpacked: {exc}") from None
    (base / "latest").write_text(f"{row.step}\n")
    problem = inputs.staged_problem(base, name)
    if problem:
        raise ReplicaRefused(f"rank {row.rank}'s replica is damaged: {problem}")


def choose(job: TrainingJob, attempt: JobAttempt, claimed: list[AttemptNode], disk_step: int | None, *, contained: bool, use_replicas: bool = True) -> Resume:
    """What a re-placed attempt resumes from (see the module's docstring); the first agent to
    decide records it, the others follow."""
    disk = Resume(disk_step, "disk" if disk_step is not None else "")
    if attempt.number == 1:
        return disk
    attempt.refresh_from_db(fields=["resume_source", "resume_step", "resume_detail"])
    decided = attempt.resume_source
    on = use_replicas and enabled(job)
    step, rows = complete_step(job) if on else (None, [])
    reached = reached_step(job)
    if decided in ("disk", "start") or (not decided and (step is None or (disk_step is not None and step <= disk_step))):
        if on:
            disk.detail = (
                "no replica of every rank's state was held" if step is None else f"the newest replica (step {step}) is not newer than the disk checkpoint"
            )
        return record(attempt, disk, reached, considered=on)
    if decided == "replica":
        step = attempt.resume_step
        rows = list(Replica.objects.filter(job=job, step=step or 0).select_related("holder"))
    mine = {p.rank for p in claimed}
    inputs_dir = workdirs.make_readable(*inputs.inputs_dir(job))
    try:
        for row in rows:
            if row.rank in mine:
                stage_replica(job, row, inputs_dir)
        if decided == "replica" and {r.rank for r in rows} < mine:
            raise ReplicaRefused(f"the replica of step {step} is gone for some rank")
    except (ReplicaRefused, OSError) as exc:
        if decided == "replica":
            raise ReplicaRefused(str(exc)) from None
        disk.detail = f"the replica of step {step} was refused: {exc}"
        logger.warning("job %s attempt %s: %s; resuming from disk", job.pk, attempt.number, disk.detail)
        return record(attempt, disk, reached)
    holders = ", ".join(sorted({r.holder.name for r in rows}))
    chosen = Resume(step, "replica", f"held in memory on {holders}")
    if disk_step is not None:
        chosen.detail += f"; the disk checkpoint had step {disk_step}"
    chosen.env = {"CKPT_RESUME_ROOT": f"{inputs.IN_RUN}/{REPLICA}" if contained else str(inputs_dir / REPLICA)}
    return record(attempt, chosen, reached)


def record(attempt: JobAttempt, chosen: Resume, reached: int | None, *, considered: bool = True) -> Resume:
    """Write the choice on the attempt (the first agent's stays) and the run's log line."""
    if chosen.step is not None and reached is not None and reached >= chosen.step:
        lost = reached - chosen.step
        chosen.detail = f"{lost} step{'s' if lost != 1 else ''} lost (the last attempt's log reached step {reached}); " + chosen.detail
    runs.resume_chosen(attempt, chosen.source or "start", chosen.step, chosen.detail.rstrip("; "))
    where = {"replica": "the in-memory replica", "disk": "the disk checkpoint"}.get(chosen.source, "the start")
    said = f"[satrain] attempt {attempt.number} continues from {where}" + (f" of step {chosen.step}" if chosen.step is not None else "")
    if chosen.detail:
        said += f": {chosen.detail.rstrip('; ')}"
    if considered:  # the run's log says it where replicas were looked at
        chosen.setup = [f"echo {shlex.quote(said)}"]
    return chosen
