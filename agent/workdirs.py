"""A run's directories, made and checked by the agent through file descriptors, never by a path
a job could have swapped.

Standard library only (and ckptlib's layout reader, itself standard library only). Every directory the agent hands to a container is the *leaf* of a chain
of directories the agent made itself and owns (root, not writable by anyone else): the job owns
the leaf (its uid, through ``fchown`` on the descriptor), so nothing it does inside can move the
leaf or any directory above it between the agent's check and the container's mount. Each
component is opened with ``O_NOFOLLOW | O_DIRECTORY`` relative to the one above it: a symlink, a
FIFO or a file where a directory should be is refused, not followed.
"""

from __future__ import annotations

import os
import secrets
import socket
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

# The fence's reader (ckptlib reads it in the run the same way): standard library only.
from ckptlib._layout import FENCE_MAX_BYTES, read_small_file

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class DirectoryRefused(OSError):
    """A directory of the run is not one the agent may use; the message says why."""


def _open_or_make(parent_fd: int, name: str, mode: int) -> int:
    with suppress(FileExistsError):
        os.mkdir(name, mode, dir_fd=parent_fd)
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as exc:
        raise DirectoryRefused(f"{name!r} is not a plain directory (a link, a file or a FIFO): {exc.strerror}") from None


def _check_agent_owned(fd: int, where: str) -> None:
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise DirectoryRefused(f"{where} belongs to a job (another job's output directory?), so nothing may be placed inside it")


@contextmanager
def opened_chain(root: Path, parts: Sequence[str], *, create: bool = True, mode: int = 0o755) -> Iterator[int]:
    """The descriptor of ``root/parts…`` (made where missing when ``create``), every component
    below ``root`` opened without following links; ``root`` itself is the operator's or the
    agent's own directory. Closed on exit."""
    for part in parts:
        if part in ("", ".", "..") or "/" in part:
            raise DirectoryRefused(f"{part!r} is not a directory name")
    if create:
        Path(root).mkdir(parents=True, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts:
            if create:
                child = _open_or_make(fd, part, mode)
            else:
                try:
                    child = os.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise DirectoryRefused(f"{part!r}: {exc.strerror}") from None
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def make_leaf(root: Path, parts: Sequence[str], *, uid: int | None, mode: int = 0o750) -> Path:
    """Make ``root/parts…`` for a run: every directory between ``root`` and the leaf made by the
    agent and owned by it (refused if it is not: a job's directory is never a parent of
    another's), the leaf owned by ``uid`` (``fchown`` on its descriptor; None: the agent keeps
    it). Returns its path, stable from here to the mount since no job can write above it."""
    if not parts:
        raise DirectoryRefused("a run's directory must lie below its root")
    *above, leaf = parts
    with opened_chain(root, above) as parent:
        _check_chain(root, above)
        child = _open_or_make(parent, leaf, mode)
        try:
            info = os.fstat(child)
            if uid is not None:
                if info.st_uid not in (os.geteuid(), uid):
                    raise DirectoryRefused(f"{leaf!r} belongs to another user (uid {info.st_uid})")
                if info.st_uid != uid and os.geteuid() == 0:
                    os.fchown(child, uid, uid)
                os.fchmod(child, mode)
        finally:
            os.close(child)
    return Path(root).joinpath(*parts)


def _check_chain(root: Path, parts: Sequence[str]) -> None:
    """Every directory below ``root`` down to ``parts`` is the agent's own."""
    for depth in range(1, len(parts) + 1):
        with opened_chain(root, parts[:depth], create=False) as fd:
            _check_agent_owned(fd, "/".join(parts[:depth]))


def make_private(root: Path, parts: Sequence[str], *, owner: int | None = None) -> Path:
    """The agent's own directory below ``root`` (a run's records: 0700, never a job's);
    ``owner``: the unprivileged account a scheduler runs the rank as (a Slurm site's service
    account) owns the leaf, the directories above it only traversable by others (0711)."""
    with opened_chain(root, parts, mode=0o700 if owner is None else 0o711) as fd:
        if owner is None or os.fstat(fd).st_uid != owner:
            _check_agent_owned(fd, "/".join(parts))
            if owner is not None:
                os.fchown(fd, owner, -1)
        os.fchmod(fd, 0o700)
    return Path(root).joinpath(*parts)


def make_readable(root: Path, parts: Sequence[str]) -> Path:
    """The agent's own directory below ``root`` that runs read (0755, mounted read-only), every
    directory down to it the agent's."""
    with opened_chain(root, parts) as fd:
        _check_chain(root, parts)
        os.fchmod(fd, 0o755)
    return Path(root).joinpath(*parts)


FENCE_DIR = "fence"
FENCE_FILE = "attempt"


def write_fence(root: Path, job_id: int, attempt: int, identity: str = "") -> Path:
    """The job's fence, ``root/<job>/fence/attempt``: the number of the job's attempt that owns
    its output now (then ``identity``, which tells this job from an earlier one of the same id
    whose directory was left behind), which ckptlib reads before each commit, rotation and file
    install (a run of an earlier attempt, still going on a node taken as lost, then commits
    nothing). The directory is the agent's own (0755: runs read it, mounted read-only); the file
    is replaced whole, never by a smaller number for the same job. Returns the directory."""
    parts = [str(job_id), FENCE_DIR]
    with opened_chain(root, parts) as fd:
        _check_chain(root, parts)
        os.fchmod(fd, 0o755)
        try:
            number, _, held = read_small_file(FENCE_FILE, FENCE_MAX_BYTES, dir_fd=fd).decode().strip().partition(" ")
            current = int(number) if held == identity else 0
        except (OSError, ValueError):
            current = 0
        if attempt > current:
            # Unique on a shared JOB_WORK_ROOT: the agents of one attempt on several hosts.
            scratch = f".{FENCE_FILE}.{socket.gethostname()}.{os.getpid()}.{secrets.token_hex(4)}"
            out = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=fd)
            try:
                os.fchmod(out, 0o644)
                os.write(out, f"{attempt} {identity}".strip().encode() + b"\n")
                os.fsync(out)
            finally:
                os.close(out)
            os.replace(scratch, FENCE_FILE, src_dir_fd=fd, dst_dir_fd=fd)
            os.fsync(fd)
    return Path(root).joinpath(*parts)


def read_beneath(root: Path, parts: Sequence[str]) -> str | None:
    """A ``/proc/self/fd`` path to ``root/parts…`` opened without following any link below
    ``root``, for reading what a job wrote there (None if it is missing or not a plain
    directory). The caller must close it with ``close_beneath``."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    for part in parts:
        try:
            child = os.open(part, DIR_FLAGS | os.O_NONBLOCK, dir_fd=fd)
        except OSError:
            os.close(fd)
            return None
        os.close(fd)
        fd = child
    return f"/proc/self/fd/{fd}"


def close_beneath(path: str | None) -> None:
    if path and path.startswith("/proc/self/fd/"):
        with suppress(OSError, ValueError):
            os.close(int(path.rsplit("/", 1)[1]))
