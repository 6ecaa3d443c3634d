"""Where checkpoints live and which are committed: the layout readers need, standard library
only, so a process that only looks for the latest checkpoint (the console, placing a resumed run)
never imports torch. The commit protocol that produces this layout is in ``_format``.

The node agent reads this layout as root from a directory the job controls, so every read here
treats what it finds as hostile: no symlink below the checkpoint root is followed, only regular
files and real directories count, files are read with a size limit, and nothing blocks (a FIFO
named ``latest`` is refused, not waited on). A bad entry counts as absent; one bad checkpoint
directory costs only the job that made it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import zlib
from pathlib import Path

logger = logging.getLogger(__name__)

CHECKPOINT_SUBDIR = "concurrent_checkpoint"
CHECKPOINT_PREFIX = "checkpoint-"
TMP_SUFFIX = ".tmp"
LATEST_NAME = "latest"
MANIFEST_NAME = "ckptlib.json"

LATEST_MAX_BYTES = 64  # a step number and a newline
MANIFEST_MAX_BYTES = 4 << 20
MAX_MANIFEST_FILES = 1000
# The manifest's cheap checksum of each file: CRC-32 of SAMPLE_BLOCKS blocks of SAMPLE_BYTES at
# evenly spaced offsets (the first at 0, the last ending at the file's end; the whole file when
# it is smaller), read back once at commit and again by every check.
SAMPLE_BLOCKS = 16
SAMPLE_BYTES = 64 << 10
CHECKSUM_NAME = "sampled-crc32"
MAX_LISTING_ENTRIES = 100_000  # rotation keeps a handful; a job that makes more only hides its own

COMMITTED_RE = re.compile(r"^checkpoint-(\d+)$")
_NO_FOLLOW = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def checkpoint_root(output_dir: str | os.PathLike[str]) -> Path:
    """Returns ``<output_dir>/concurrent_checkpoint``."""
    return Path(output_dir) / CHECKPOINT_SUBDIR


def committed_dir(root: Path, step: int) -> Path:
    return root / f"{CHECKPOINT_PREFIX}{step}"


def tmp_dir(root: Path, step: int) -> Path:
    return root / f"{CHECKPOINT_PREFIX}{step}{TMP_SUFFIX}"


def read_small_file(path: str | os.PathLike[str], limit: int, *, dir_fd: int | None = None) -> bytes:
    """The whole content of a small regular file that someone else may control.

    The last component of ``path`` is not followed if it is a symlink, a FIFO or device is refused
    without waiting for a writer (``O_NONBLOCK``, then ``fstat``), and a file over ``limit`` bytes
    is refused rather than read in part.

    Args:
        path: The file; relative to ``dir_fd`` when that is given.
        limit: The most bytes the file may hold.
        dir_fd: A directory descriptor ``path`` is relative to.

    Returns:
        The file's bytes.

    Raises:
        OSError: The file is missing, a symlink, not a regular file, or larger than ``limit``.
    """
    fd = os.open(path, _NO_FOLLOW, dir_fd=dir_fd)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{os.fspath(path)} is not a regular file")
        if info.st_size > limit:
            raise OSError(f"{os.fspath(path)} holds {info.st_size} bytes, more than {limit}")
        payload = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    if len(payload) > limit:  # grew since fstat
        raise OSError(f"{os.fspath(path)} holds more than {limit} bytes")
    return payload


# The platform's fence (docs/failover.md, "A lost node's run"): ``$JOB_FENCE`` names a file,
# read-only to the run, holding the number of the job's attempt that owns its output now;
# ``$JOB_ATTEMPT`` is this run's. Once a later attempt has started (the node this run is on was
# taken as lost and the job re-placed), this run commits and rotates nothing.
FENCE_ENV = "JOB_FENCE"
ATTEMPT_ENV = "JOB_ATTEMPT"
FENCE_MAX_BYTES = 128  # the attempt, then the platform's name for the job


def superseded_by() -> int | None:
    """The later attempt of this job that owns its output now (the fence names one after
    ``$JOB_ATTEMPT``), or None: this run still does. Outside the platform (no fence, or one that
    cannot be read) None: nothing is ever refused for want of a fence."""
    fence, mine = os.environ.get(FENCE_ENV), os.environ.get(ATTEMPT_ENV, "")
    if not fence or not mine.isdecimal():
        return None
    try:
        owner = int(read_small_file(fence, FENCE_MAX_BYTES).split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return owner if owner > int(mine) else None


def superseded_message(what: str) -> str | None:
    """ "attempt 3 of this job has started elsewhere and owns its output: …", or None."""
    owner = superseded_by()
    if owner is None:
        return None
    return f"attempt {owner} of this job has started elsewhere and owns its output now: this run (attempt {os.environ.get(ATTEMPT_ENV)}) {what}"


def open_dir(path: str | os.PathLike[str], *, dir_fd: int | None = None) -> int:
    """A descriptor of a real directory: the last component is never followed."""
    return os.open(path, _NO_FOLLOW | os.O_DIRECTORY, dir_fd=dir_fd)


def _is_committed(root_fd: int, name: str) -> bool:
    """``name`` under the root is a real directory holding a regular-file manifest."""
    try:
        directory = open_dir(name, dir_fd=root_fd)
    except OSError:
        return False
    try:
        manifest = os.stat(MANIFEST_NAME, dir_fd=directory, follow_symlinks=False)
    except OSError:
        return False
    finally:
        os.close(directory)
    return stat.S_ISREG(manifest.st_mode)


def sampled_crc32(fd: int, size: int) -> int:
    """The manifest's cheap checksum of an open file of ``size`` bytes (``SAMPLE_BLOCKS``)."""
    if size <= SAMPLE_BLOCKS * SAMPLE_BYTES:
        offsets = [0]
        length = size
    else:
        last = size - SAMPLE_BYTES
        offsets = [k * last // (SAMPLE_BLOCKS - 1) for k in range(SAMPLE_BLOCKS)]
        length = SAMPLE_BYTES
    crc = 0
    for offset in offsets:
        block = os.pread(fd, length, offset)
        if len(block) != length:
            raise OSError(f"short read at {offset}")
        crc = zlib.crc32(block, crc)
    return crc


def checkpoint_problem(root_fd: int, name: str) -> str | None:
    """Why the checkpoint directory ``name`` must not be resumed, naming the file; None if its
    files have the sizes (and the checksums) its manifest records."""
    try:
        directory = open_dir(name, dir_fd=root_fd)
    except OSError as error:
        return f"{name}: {error.strerror or error}"
    try:
        return _manifest_problem(directory, name, MANIFEST_NAME)
    finally:
        os.close(directory)


def _manifest_problem(directory: int, where: str, manifest_name: str) -> str | None:
    """What is wrong with the files the manifest ``manifest_name`` of the open ``directory``
    lists (``where``: how messages name the directory), or None."""
    read = _read_manifest_at(directory, f"{where}/{manifest_name}", manifest_name)
    if isinstance(read, str):
        return read
    files, checksums = read
    for file_name, size in files.items():
        problem = _entry_problem(directory, f"{where}/{file_name}", file_name, size, checksums.get(file_name))
        if problem is not None:
            return problem
    return None


def _read_manifest_at(directory: int, where: str, manifest_name: str) -> str | tuple[dict[str, int], dict[str, int]]:
    """A manifest's files (name → size) and checksums (name → sampled CRC-32), or what is wrong
    with it. Every entry's name and value are checked here: a name is one path component."""
    try:
        manifest = json.loads(read_small_file(manifest_name, MANIFEST_MAX_BYTES, dir_fd=directory))
    except (OSError, ValueError) as error:
        return f"{where}: cannot be read ({error})"
    if not isinstance(manifest, dict):
        return f"{where}: not a JSON object"
    files = manifest.get("files", {})  # a manifest without a file list has nothing to check
    if not isinstance(files, dict):
        return f"{where}: its file list is not an object"
    if len(files) > MAX_MANIFEST_FILES:  # the agent reads this as root: bounded work per checkpoint
        return f"{where}: lists {len(files)} files, more than {MAX_MANIFEST_FILES}"
    for file_name, size in files.items():
        if not isinstance(file_name, str) or "/" in file_name or file_name in {"", ".", ".."} or type(size) is not int:
            return f"{where}: bad entry {file_name!r}"
    listed = manifest.get("checksums") if manifest.get("checksum") == CHECKSUM_NAME else None
    checksums = {k: v for k, v in listed.items() if type(v) is int} if isinstance(listed, dict) else {}
    return files, checksums


def _entry_problem(directory: int, where: str, file_name: str, size: int, expected: int | None) -> str | None:
    try:
        fd = os.open(file_name, _NO_FOLLOW, dir_fd=directory)
    except OSError as error:
        return f"{where}: {error.strerror or error}"
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return f"{where}: not a regular file"
        if info.st_size != size:
            return f"{where}: holds {info.st_size} bytes, the manifest records {size}"
        if expected is not None and sampled_crc32(fd, size) != expected:
            return f"{where}: its checksum ({CHECKSUM_NAME}) differs from the manifest's"
    except OSError as error:
        return f"{where}: cannot be read ({error})"
    finally:
        os.close(fd)
    return None


# DeepSpeed's layout (``<save_dir>/<tag>/``, ``latest`` beside the tags) has no ckptlib.json:
# each rank that writes files into a tag through ``ckptlib.deepspeed`` records them in its own
# ``ckptlib-rank<r>.json`` there, in the same format, before DeepSpeed writes ``latest``.
_RANK_MANIFEST_RE = re.compile(r"^ckptlib-rank(\d+)\.json$")


def rank_manifest_name(rank: int) -> str:
    return f"ckptlib-rank{rank}.json"


def _rank_manifests(directory: int) -> list[str]:
    """The rank manifests' names in an open directory, sorted (scandir reads a duplicate fd)."""
    with os.scandir(directory) as entries:
        return sorted(entry.name for entry in entries if _RANK_MANIFEST_RE.match(entry.name))


def file_entry(path: Path) -> tuple[int, int]:
    """A file's size and sampled CRC-32, as a manifest records them (read without following a link)."""
    fd = os.open(path, _NO_FOLLOW)
    try:
        size = os.fstat(fd).st_size
        return size, sampled_crc32(fd, size)
    finally:
        os.close(fd)


def tag_problem(tag_dir: Path) -> str | None:
    """``checkpoint_problem`` for a DeepSpeed tag directory: every rank's manifest in it is
    checked (a tag no ckptlib rank wrote has none, and nothing to check)."""
    try:
        directory = open_dir(tag_dir)
    except OSError as error:
        return f"{tag_dir}: {error.strerror or error}"
    try:
        for name in _rank_manifests(directory):
            problem = _manifest_problem(directory, str(tag_dir), name)
            if problem is not None:
                return problem
    except OSError as error:
        return f"{tag_dir}: cannot be listed ({error})"
    finally:
        os.close(directory)
    return None


def file_problem(path: Path) -> str | None:
    """What is wrong with one file of a DeepSpeed tag, by the rank manifest that lists it; None
    if it matches or no manifest lists it (a file DeepSpeed wrote itself)."""
    try:
        directory = open_dir(path.parent)
    except OSError as error:
        return f"{path.parent}: {error.strerror or error}"
    try:
        for name in _rank_manifests(directory):
            read = _read_manifest_at(directory, f"{path.parent}/{name}", name)
            if isinstance(read, str):
                return read
            files, checksums = read
            if path.name in files:
                return _entry_problem(directory, str(path), path.name, files[path.name], checksums.get(path.name))
    except OSError as error:
        return f"{path.parent}: cannot be listed ({error})"
    finally:
        os.close(directory)
    return None


def damage_of(directory: Path) -> str | None:
    """``checkpoint_problem`` for a checkpoint directory given by its path."""
    try:
        parent = open_dir(directory.parent)
    except OSError as error:
        return f"{directory.parent}: {error.strerror or error}"
    try:
        return checkpoint_problem(parent, directory.name)
    finally:
        os.close(parent)


def _committed_steps_at(root_fd: int) -> list[int]:
    steps = []
    # scandir reads a duplicate of the descriptor and closes only that: root_fd stays the caller's.
    with os.scandir(root_fd) as entries:
        for count, entry in enumerate(entries):
            if count >= MAX_LISTING_ENTRIES:
                logger.warning("checkpoint listing stopped after %d entries", MAX_LISTING_ENTRIES)
                break
            match = COMMITTED_RE.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False) and _is_committed(root_fd, entry.name):
                problem = checkpoint_problem(root_fd, entry.name)
                if problem is not None:
                    logger.warning("[Concurrent Checkpoint] damaged checkpoint skipped: %s", problem)
                    continue
                steps.append(int(match.group(1)))
    return sorted(steps)


def committed_steps(root: Path) -> list[int]:
    """Steps of the committed checkpoints under ``root``, ascending. Temporary dirs never count,
    nor do symlinks (the root itself included), checkpoints whose manifest is not a regular file,
    or damaged ones (a file whose size or checksum differs from the manifest's: a warning names
    it, ``checkpoint_problem``)."""
    try:
        root_fd = open_dir(root)
    except OSError:
        return []
    try:
        return _committed_steps_at(root_fd)
    except OSError as exc:
        logger.warning("cannot list checkpoints in %s: %s", root, exc)
        return []
    finally:
        os.close(root_fd)


def read_latest(root: Path) -> int | None:
    """The newest committed step: the ``latest`` marker if it names a whole checkpoint, else a listing.

    Never blocks and never raises: a marker that is not a small regular file counts as missing,
    and a root that cannot be listed (missing, a symlink, unreadable) has no checkpoint.
    """
    try:
        root_fd = open_dir(root)
    except OSError:
        return None
    try:
        steps = _committed_steps_at(root_fd)
        try:
            marked: int | None = int(read_small_file(LATEST_NAME, LATEST_MAX_BYTES, dir_fd=root_fd).decode("ascii").strip())
        except (OSError, ValueError):
            marked = None
    except OSError as exc:
        logger.warning("cannot list checkpoints in %s: %s", root, exc)
        return None
    finally:
        os.close(root_fd)
    if marked is not None and marked in steps and marked == max(steps):
        return marked
    # The marker lags by at most one rename (crash between commit steps 4 and 5) or is missing.
    return steps[-1] if steps else None
