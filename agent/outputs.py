"""What a job wrote, as its users list and download it: its output directory, its work directory
(its code and what the run wrote there, such as the guide's ``./results``) and each checkpoint it
committed in them.

Everything is a job's own writing, so hostile: every directory is opened from the agent's or
operator's root down, one component at a time, without following a link
(``agent.workdirs.read_beneath`` and ``O_NOFOLLOW`` below it); a link is listed as one and never
served; a path with ``..``, an absolute one, or one through a link is refused. A listing stops
at ``MAX_ENTRIES`` (and says so); an archive is a plain tar streamed as it is read, a file at a
time, so a large checkpoint never sits in memory. The console reads what the nodes wrote where
it sees ``JOB_WORK_ROOT`` and the project's directories: on one host, or on the shared
filesystem a cluster's nodes write to (docs/deployment.md).
"""

from __future__ import annotations

import os
import re
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from agent import resume, workdirs
from ckptlib._layout import CHECKPOINT_PREFIX
from jobs.models import TrainingJob
from jobs.services.paths import PathRefused, output_location
from logs.models import Checkpoint

MAX_ENTRIES = 5000  # in a listing
MAX_ARCHIVE_ENTRIES = 200_000
CHUNK = 1 << 20
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TREES = ("output", "work")


class OutputRefused(ValueError):
    """Not something of the job's that may be served; the message says why."""


class BadPath(OutputRefused):
    """A path that could only lead outside the directory (``..``, absolute, a NUL)."""


@dataclass(frozen=True)
class Tree:
    """A directory of the job's: ``parts`` below ``root`` (the agent's or operator's), and the
    name its runs gave it."""

    name: str
    root: Path
    parts: tuple[str, ...]
    in_run: str


@dataclass(frozen=True)
class Entry:
    path: str  # below the tree, "/"-separated
    kind: str  # file | directory | link | other
    size: int


def tree_of(job: TrainingJob, name: str) -> Tree:
    """``output``, ``work`` or ``checkpoint-<step>``; OutputRefused if the job has no such one."""
    try:
        location = output_location(job)
    except PathRefused as exc:
        raise OutputRefused(f"The job's output directory cannot be read: {exc}") from None
    if name == "output":
        return Tree(name, location.root, tuple(location.parts), str(location.path) if location.in_volume else "/job/output")
    if name == "work":
        return Tree(name, Path(settings.JOB_WORK_ROOT), (str(job.pk), "work"), "/job/work")
    step = name.removeprefix(CHECKPOINT_PREFIX)
    if name.startswith(CHECKPOINT_PREFIX) and step.isdigit() and len(step) < 19:
        row = Checkpoint.objects.filter(job=job, step=int(step)).order_by("-attempt", "-committed_at").first()
        found = resume.checkpoint_dir_of(row.path, resume.places(job, location)) if row is not None else None
        if row is not None and found is not None:
            place, below = found
            return Tree(name, place.root, (*place.parts, *below, name), row.path)
        raise OutputRefused(f"The job has no committed checkpoint at step {step} in its work or output directory.")
    raise OutputRefused(f"{name[:40]!r} is none of the job's directories: output, work or checkpoint-<step>.")


def checkpoints_on_disk(job: TrainingJob, limit: int = 500) -> list[tuple[Checkpoint, bool]]:
    """The job's committed checkpoints, newest step first (one row per step), each with whether
    its directory is still there to download (rotation removes old ones)."""
    try:
        known = resume.places(job, output_location(job))
    except PathRefused:
        known = []
    found: list[tuple[Checkpoint, bool]] = []
    seen: set[int] = set()
    for row in Checkpoint.objects.filter(job=job).order_by("-step", "-attempt", "-committed_at")[: limit * 2]:
        if row.step in seen or len(found) >= limit:
            continue
        seen.add(row.step)
        located = resume.checkpoint_dir_of(row.path, known) if row.path else None
        there = False
        if located is not None:
            place, below = located
            opened = workdirs.read_beneath(place.root, (*place.parts, *below, f"{CHECKPOINT_PREFIX}{row.step}"))
            there = opened is not None
            workdirs.close_beneath(opened)
        found.append((row, there))
    return found


def names_of(path: str) -> tuple[str, ...]:
    """A path below a tree as names; OutputRefused for ``..``, an absolute path, a NUL."""
    if "\x00" in path or path.startswith("/") or len(path) > 4000:
        raise BadPath("Give a path relative to the directory, without a NUL.")
    names = tuple(n for n in path.split("/") if n not in ("", "."))
    if ".." in names:
        raise BadPath("'..' is not allowed: only what lies inside the directory is served.")
    return names


def open_dir(tree: Tree, names: tuple[str, ...] = ()) -> int:
    """A descriptor of the tree's directory ``names`` (no link followed); OutputRefused if missing."""
    opened = workdirs.read_beneath(tree.root, (*tree.parts, *names))
    if opened is None:
        where = "/".join(names) or "the directory"
        raise OutputRefused(f"{where} does not exist (yet), or is a link: nothing there to serve.")
    return int(opened.rsplit("/", 1)[1])


def kind_of(mode: int) -> str:
    return "file" if stat.S_ISREG(mode) else "directory" if stat.S_ISDIR(mode) else "link" if stat.S_ISLNK(mode) else "other"


def natural(name: str) -> list[tuple[int, int, str]]:
    """A sort key that puts checkpoint-100 after checkpoint-20."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def walk(fd: int, prefix: str, limit: int, *, strict: bool = False) -> Iterator[tuple[Entry, int | None]]:
    """Every entry below the open directory ``fd`` (sorted, depth first), with a descriptor of each
    regular file (the caller closes it) or None; at most ``limit`` entries. An entry that vanished
    or cannot be opened is skipped, or with ``strict`` raises its OSError (a copy must be whole)."""
    count = 0
    stack: list[tuple[int, str, list[str]]] = [(fd, prefix, sorted(os.listdir(fd), key=natural))]
    try:
        while stack:
            directory, where, names = stack[-1]
            if not names:
                stack.pop()
                if directory != fd:
                    os.close(directory)
                continue
            name = names.pop(0)
            count += 1
            if count > limit:
                return
            try:
                info = os.stat(name, dir_fd=directory, follow_symlinks=False)
            except OSError:
                if strict:
                    raise
                continue
            path = f"{where}{name}"
            kind = kind_of(info.st_mode)
            if kind == "directory":
                try:
                    child = os.open(name, workdirs.DIR_FLAGS, dir_fd=directory)
                except OSError:
                    if strict:
                        raise
                    continue
                try:
                    listing = sorted(os.listdir(child), key=natural)
                except OSError:
                    os.close(child)
                    if strict:
                        raise
                    continue
                yield Entry(path, kind, 0), None
                stack.append((child, path + "/", listing))
            elif kind == "file":
                try:
                    handle = os.open(name, FILE_FLAGS, dir_fd=directory)
                except OSError:
                    if strict:
                        raise
                    continue
                yield Entry(path, kind, info.st_size), handle
            else:
                yield Entry(path, kind, 0), None
    finally:
        for directory, _, _ in stack:
            if directory != fd:
                os.close(directory)


def listing(job: TrainingJob, name: str) -> tuple[Tree, list[Entry], bool]:
    """The tree, its entries (at most MAX_ENTRIES) and whether there were more."""
    tree = tree_of(job, name)
    try:
        fd = open_dir(tree)
    except OutputRefused:
        return tree, [], False
    entries: list[Entry] = []
    try:
        for entry, handle in walk(fd, "", MAX_ENTRIES + 1):
            if handle is not None:
                os.close(handle)
            entries.append(entry)
    finally:
        os.close(fd)
    return tree, entries[:MAX_ENTRIES], len(entries) > MAX_ENTRIES


def open_file(job: TrainingJob, name: str, path: str) -> tuple[int, int, str] | None:
    """(a descriptor, its size, its file name) for the regular file ``path`` of the tree, or None
    where ``path`` names a directory (served as an archive); OutputRefused otherwise."""
    tree = tree_of(job, name)
    names = names_of(path)
    if not names:
        return None
    fd = open_dir(tree, names[:-1])
    try:
        info = os.stat(names[-1], dir_fd=fd, follow_symlinks=False)
    except OSError:
        os.close(fd)
        raise OutputRefused(f"{path} does not exist.") from None
    try:
        if stat.S_ISDIR(info.st_mode):
            return None
        if not stat.S_ISREG(info.st_mode):
            raise OutputRefused(f"{path} is a {kind_of(info.st_mode)}, not a file: links are never followed.")
        handle = os.open(names[-1], FILE_FLAGS, dir_fd=fd)
    finally:
        os.close(fd)
    return handle, os.fstat(handle).st_size, names[-1]


def archive(job: TrainingJob, name: str, path: str = "") -> tuple[str, Iterator[bytes]]:
    """The archive's name and its bytes (a tar, streamed) of the tree's directory ``path``;
    OutputRefused when there is none. Links and other special files are left out."""
    tree = tree_of(job, name)
    names = names_of(path)
    fd = open_dir(tree, names)
    top = names[-1] if names else name if name.startswith(CHECKPOINT_PREFIX) else f"{job.name}-{name}"

    def stream() -> Iterator[bytes]:
        try:
            for entry, handle in walk(fd, f"{top}/", MAX_ARCHIVE_ENTRIES):
                if entry.kind not in ("file", "directory"):
                    continue
                info = tarfile.TarInfo(entry.path)
                if handle is None:
                    info.type, info.mode = tarfile.DIRTYPE, 0o755
                    yield info.tobuf(format=tarfile.PAX_FORMAT)
                    continue
                try:
                    stats = os.fstat(handle)
                    info.size, info.mode, info.mtime = stats.st_size, 0o644, int(stats.st_mtime)
                    yield info.tobuf(format=tarfile.PAX_FORMAT)
                    left = info.size
                    while left > 0:
                        chunk = os.read(handle, min(CHUNK, left))
                        if not chunk:  # shrank while read: pad to the size the header said
                            chunk = b"\0" * min(CHUNK, left)
                        left -= len(chunk)
                        yield chunk
                    if info.size % tarfile.BLOCKSIZE:
                        yield b"\0" * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
                finally:
                    os.close(handle)
            yield b"\0" * (2 * tarfile.BLOCKSIZE)
        finally:
            os.close(fd)

    return f"{top}.tar", stream()


def file_chunks(handle: int) -> Iterator[bytes]:
    try:
        while chunk := os.read(handle, CHUNK):
            yield chunk
    finally:
        os.close(handle)
