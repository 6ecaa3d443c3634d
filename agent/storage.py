"""Storage limits, an agent plug-in: every ``JOB_STORAGE_CHECK_INTERVAL`` seconds, the disk each
live job on this agent's nodes uses, reported to the control plane (``jobs.services.runs``),
which says which runs must end; the agent ends them at once (SIGKILL, as the kubelet evicts a pod
over its ephemeral-storage limit).

What counts for a job: its work directory, its own output directory (only that directory where it
lies in a shared project volume) and each of its containers' writable layer (Podman's overlay
``UpperDir``, looked up once per run). They are measured as the kubelet measures ephemeral
storage: a walk of the tree summing the blocks allocated to each entry (``st_blocks * 512``, so a
sparse file counts what it holds, not its length), never following a symbolic link, each
hard-linked inode counted once, never descending into another filesystem. Every directory is
opened relative to its parent with ``O_NOFOLLOW``, so a job that swaps a directory for a link
mid-walk leads the walk nowhere outside its tree.

A walk is bounded: at most ``WALK_MAX_ENTRIES`` entries and ``WALK_MAX_SECONDS`` per job and pass,
and it runs in a thread of its own, one pass at a time, so a hostile tree of millions of files
never stalls the agent's loop (its output, exits and heartbeats). A walk cut short reports what
it counted so far, a lower bound ("at least").
"""

from __future__ import annotations

import logging
import math
import os
import signal
import stat
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings

from agent import runfiles
from agent.launch import engine_env
from agent.plugins import AgentView
from agent.processes import run_dir
from agent.sandbox import podman_path, root_tool_env
from jobs.models import AttemptNode, Project
from jobs.services import runs
from jobs.services.limits import StorageUse, job_storage_limit
from jobs.services.paths import PathRefused, output_location

logger = logging.getLogger(__name__)

WALK_MAX_ENTRIES = 1_000_000  # per job and pass
WALK_MAX_SECONDS = 20.0  # per job and pass
# Directories held open at once while walking down (two descriptors each); deeper ones are
# reopened later from the tree's top, one component at a time.
WALK_MAX_OPEN = 64
INSPECT_TIMEOUT = 20.0
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@dataclass(frozen=True)
class Tree:
    """A directory to measure: ``parts`` below ``root``. ``root`` is the agent's or the operator's
    (opened as it is); every component below it is opened without following a link."""

    root: Path
    parts: tuple[str, ...] = ()


def open_below(root: Path, parts: tuple[str, ...]) -> int | None:
    """A descriptor of ``root``/``parts``, each component opened below the one above it without
    following a link; None where one is missing or refused."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        for part in parts:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    except OSError:
        os.close(fd)
        return None
    return fd


@dataclass
class Walk:
    """One job's measurement: the bytes allocated to its trees (hard links counted once across
    them), how many entries were seen, and whether a bound cut it short."""

    max_entries: int = WALK_MAX_ENTRIES
    deadline: float = math.inf  # time.monotonic()
    stopped: threading.Event | None = None
    bytes: int = 0
    entries: int = 0
    cut: bool = False
    linked: set[tuple[int, int]] = field(default_factory=set)

    def measure(self, tree: Tree) -> None:
        """Add ``tree`` (a missing or refused tree adds nothing)."""
        top = open_below(tree.root, tree.parts)
        if top is None:
            return
        try:
            info = os.fstat(top)
            self.count(info)
            deeper = self.walk_down(top, info.st_dev)
        finally:
            os.close(top)
        # Directories below the descriptors' bound, reopened from the tree's top (never followed).
        while deeper and not self.cut:
            parts = deeper.pop()
            fd = open_below(tree.root, (*tree.parts, *parts))
            if fd is None:
                continue
            try:
                deeper += [(*parts, *more) for more in self.walk_down(fd, info.st_dev)]
            finally:
                os.close(fd)

    def walk_down(self, top: int, device: int) -> list[tuple[str, ...]]:
        """Count everything below the open directory ``top``; returns the directories left at
        ``WALK_MAX_OPEN`` levels down, by their names below ``top``."""
        deeper: list[tuple[str, ...]] = []
        names: list[str] = []
        try:
            stack = [(top, os.scandir(top), False)]  # (descriptor, its listing, whether we own the descriptor)
        except OSError:
            return deeper
        try:
            while stack:
                fd, listing, _ = stack[-1]
                try:
                    entry = next(listing, None)
                except OSError:
                    entry = None  # an unreadable listing: what it gave so far counts
                if entry is None:
                    self.close(stack.pop())
                    if names:
                        names.pop()
                    continue
                if self.over_bounds():
                    return deeper
                try:
                    info = entry.stat(follow_symlinks=False)
                except OSError:
                    continue  # gone meanwhile
                self.count(info)
                if not stat.S_ISDIR(info.st_mode) or info.st_dev != device:
                    continue
                if len(stack) >= WALK_MAX_OPEN:
                    deeper.append((*names, entry.name))
                    continue
                try:
                    child = os.open(entry.name, DIR_FLAGS, dir_fd=fd)
                except OSError:
                    continue  # swapped for a link, or gone
                try:
                    opened = os.fstat(child)
                    if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
                        raise OSError("swapped")  # not the directory counted above: skipped
                    listing = os.scandir(child)
                except OSError:
                    os.close(child)
                    continue
                stack.append((child, listing, True))
                names.append(entry.name)
        finally:
            for frame in reversed(stack):
                self.close(frame)
        return deeper

    @staticmethod
    def close(frame: tuple[int, os._ScandirIterator, bool]) -> None:
        fd, listing, owned = frame
        listing.close()
        if owned:
            os.close(fd)

    def count(self, info: os.stat_result) -> None:
        self.entries += 1
        if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
            key = (info.st_dev, info.st_ino)
            if key in self.linked:
                return
            self.linked.add(key)
        self.bytes += info.st_blocks * 512

    def over_bounds(self) -> bool:
        if self.entries >= self.max_entries or (
            self.entries % 1024 == 0 and (time.monotonic() >= self.deadline or (self.stopped is not None and self.stopped.is_set()))
        ):
            self.cut = True
        return self.cut


def measure(trees: Sequence[Tree], *, max_entries: int = WALK_MAX_ENTRIES, seconds: float = WALK_MAX_SECONDS, stopped: threading.Event | None = None) -> Walk:
    """The bytes allocated to ``trees`` together, walked within the bounds."""
    walk = Walk(max_entries=max_entries, deadline=time.monotonic() + seconds, stopped=stopped)
    for tree in trees:
        if walk.cut:
            break
        walk.measure(tree)
    return walk


def container_layer(name: str, env: dict[str, str]) -> Path | None:
    """The container's writable layer on this node (Podman's overlay ``UpperDir``), or None (no
    such container, or a storage driver without one). ``env``: Podman's whole environment."""
    podman = podman_path()
    if not podman:
        return None
    try:
        done = subprocess.run(
            [podman, "container", "inspect", "--format", "{{.GraphDriver.Data.UpperDir}}", name],
            check=False,
            env=env,
            capture_output=True,
            text=True,
            timeout=INSPECT_TIMEOUT,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        logger.warning("podman container inspect %s failed: %s", name, exc)
        return None
    path = done.stdout.strip()
    if done.returncode != 0 or not path.startswith("/") or "\n" in path:
        return None
    return Path(path)


@dataclass
class JobTrees:
    """What one pass measures of a job: its directories, and its runs here (for their layers)."""

    job_id: int
    project_id: int
    attempt_id: int
    trees: list[Tree]
    containers: list[tuple[int, str]]  # (AttemptNode id, container name)


def job_trees(parts: Sequence[AttemptNode], directories: dict[int, list[Tree]]) -> list[JobTrees]:
    """This agent's live runs grouped by attempt: the job's work and output directories (kept in
    ``directories`` by attempt id, looked up once), and the containers its ranks here run in (from
    their pid records)."""
    by_attempt: dict[int, list[AttemptNode]] = defaultdict(list)
    for part in parts:
        by_attempt[part.attempt_id].append(part)
    jobs = []
    for attempt_id, ranks in by_attempt.items():
        job = ranks[0].attempt.job
        if attempt_id not in directories:
            trees = [Tree(Path(settings.JOB_WORK_ROOT), (str(job.pk), "work"))]
            try:
                location = output_location(job)
                trees.append(Tree(location.root, tuple(location.parts)))
            except PathRefused:
                pass  # its launch refused it too: nothing of it to count
            directories[attempt_id] = trees
        containers = []
        for part in ranks:
            record = runfiles.read_pid(run_dir(part))
            if record is not None and record.container:
                containers.append((part.pk, record.container))
        jobs.append(JobTrees(job.pk, job.project_id, attempt_id, directories[attempt_id], containers))
    return jobs


class StorageWatch:
    """The plug-in: one per agent (``agent.plugins.register(StorageWatch)``)."""

    def __init__(self, agent: AgentView) -> None:
        self.agent = agent
        self.next_pass = 0.0  # monotonic
        self.thread: threading.Thread | None = None
        self.results: list[StorageUse] | None = None
        self.layers: dict[tuple[int, str], Path | None] = {}  # (AttemptNode id, container) → its layer
        self.directories: dict[int, list[Tree]] = {}  # attempt id → its job's work and output directories
        self.podman_env: dict[str, str] | None = None  # made in the agent's thread (it writes Podman's files)
        self.stopped = threading.Event()

    @staticmethod
    def interval() -> float:
        return settings.JOB_STORAGE_CHECK_INTERVAL

    def next_round_in(self) -> float:
        if self.interval() <= 0 or not self.agent.live_parts():
            return math.inf
        if self.thread is not None:
            return 0.5  # a pass under way: its results are taken at the round after it ends
        if not self.next_pass:
            return self.interval()  # runs are first measured an interval after they are seen
        return max(0.0, self.next_pass - time.monotonic())

    def on_shutdown(self) -> None:
        self.stopped.set()

    def on_round(self) -> None:
        if self.thread is not None and not self.thread.is_alive():
            self.thread = None
            uses, self.results = self.results or [], None
            self.enforce(uses)
        parts = self.agent.live_parts()
        now = time.monotonic()
        if not parts or self.interval() <= 0:
            self.next_pass = 0.0
            return
        if not self.next_pass:
            self.next_pass = now + self.interval()  # a run is measured once it has run an interval
        if self.thread is not None or now < self.next_pass:
            return
        self.next_pass = now + self.interval()
        live_parts = {part.pk for part in parts}
        self.layers = {key: path for key, path in self.layers.items() if key[0] in live_parts}
        live_attempts = {part.attempt_id for part in parts}
        self.directories = {key: trees for key, trees in self.directories.items() if key in live_attempts}
        projects = {part.attempt.job.project_id for part in parts}
        totals = Project.objects.filter(pk__in=projects, storage_limit_gib__gt=0).exists()
        if job_storage_limit() is None and not totals:
            return
        jobs = job_trees(parts, self.directories)
        if self.podman_env is None and any(job.containers for job in jobs):
            self.podman_env = root_tool_env(engine_env())
        self.thread = threading.Thread(target=self.measure_all, args=(jobs,), name=f"storage-{self.agent.name}", daemon=True)
        self.thread.start()

    def measure_all(self, jobs: list[JobTrees]) -> None:
        """The pass's thread: no database, files and Podman only."""
        uses = []
        for job in jobs:
            if self.stopped.is_set():
                break
            try:
                uses.append(self.measure_job(job))
            except Exception:
                logger.exception("job %s: measuring its storage failed", job.job_id)
        self.results = uses

    def measure_job(self, job: JobTrees) -> StorageUse:
        trees = list(job.trees)
        for key in job.containers:
            if self.layers.get(key) is None:
                self.layers[key] = container_layer(key[1], self.podman_env or {})  # looked up again next pass if not found
            layer = self.layers[key]
            if layer is not None:
                trees.append(Tree(layer))
        walk = measure(trees, stopped=self.stopped)
        if walk.cut:
            logger.warning("job %s: its storage walk stopped at %s entries; counted %s bytes so far", job.job_id, walk.entries, walk.bytes)
        return StorageUse(job_id=job.job_id, project_id=job.project_id, attempt_id=job.attempt_id, used=walk.bytes, complete=not walk.cut)

    def enforce(self, uses: list[StorageUse]) -> None:
        """Report the pass's figures; end at once the runs the control plane says must end."""
        ending = set(runs.storage_measured(uses))
        if not ending:
            return
        for part in self.agent.live_parts():
            if part.attempt_id in ending:
                sent = self.agent.signal(part, signal.SIGKILL)
                logger.warning("job %s: attempt %s rank %s over its storage limit; killed: %s", part.attempt.job_id, part.attempt.number, part.rank, sent)
