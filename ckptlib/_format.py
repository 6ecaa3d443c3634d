"""On-disk layout of concurrent checkpoints and the commit protocol.

Layout under ``<output_dir>/concurrent_checkpoint/``::

    checkpoint-<step>/            committed checkpoints (Trainer file names)
    checkpoint-<step>.tmp/        a checkpoint being written; never selected
    latest                        text file holding the step of the newest commit

Commit order (each step durable before the next):

1. every rank writes its files into ``checkpoint-<step>.tmp/`` and fsyncs them;
2. in a group of more than one process, every rank writes and fsyncs ``.rank-<r>.done``;
3. rank 0 waits for all markers, writes ``ckptlib.json`` (the manifest), fsyncs the directory;
4. rank 0 renames ``checkpoint-<step>.tmp`` to ``checkpoint-<step>`` and fsyncs the parent;
5. rank 0 writes ``latest.tmp``, fsyncs it and renames it over ``latest``.

A crash before 4 leaves only a ``.tmp`` directory, which readers ignore; a crash between 4 and 5
leaves a whole checkpoint that readers find by listing even though ``latest`` lags.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch

from ckptlib._layout import (
    CHECKPOINT_PREFIX,
    CHECKPOINT_SUBDIR,
    LATEST_NAME,
    MANIFEST_NAME,
    TMP_SUFFIX,
    checkpoint_root,
    committed_dir,
    committed_steps,
    read_latest,
    superseded_message,
    tmp_dir,
)
from ckptlib._types import CheckpointError

# The layout's names are re-exported: the layout is part of the format.
__all__ = [
    "CHECKPOINT_PREFIX",
    "CHECKPOINT_SUBDIR",
    "FORMAT_VERSION",
    "LATEST_NAME",
    "MANIFEST_NAME",
    "MODEL_FILE",
    "TMP_SUFFIX",
    "TRAINER_STATE_FILE",
    "checkpoint_root",
    "commit",
    "committed_dir",
    "committed_steps",
    "fsync_path",
    "rank_marker",
    "read_latest",
    "read_manifest",
    "remove_stale_tmp_dirs",
    "remove_tree",
    "rng_file_name",
    "rotate",
    "safetensors_header",
    "superseded_message",
    "tmp_dir",
    "write_at",
    "write_bytes_durably",
    "write_manifest",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1

# Trainer-compatible names for the well-known keys of a state.
MODEL_FILE = "model.safetensors"
TRAINER_STATE_FILE = "trainer_state.json"


# Safetensors dtype codes.
_SAFETENSORS_DTYPES: dict[torch.dtype, str] = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}

# Large writes are split so one os.write never asks the kernel for more than this.
_WRITE_CHUNK = 64 << 20


def rank_marker(directory: Path, rank: int) -> Path:
    return directory / f".rank-{rank}.done"


def rng_file_name(rank: int, world_size: int) -> str:
    """The Trainer's RNG file name: ``rng_state.pth`` alone, ``rng_state_<rank>.pth`` in a group."""
    return "rng_state.pth" if world_size <= 1 else f"rng_state_{rank}.pth"


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by its path (a directory's entries: renames and new files)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes_durably(path: Path, payload: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def write_at(fd: int, views: list[memoryview], offset: int) -> int:
    """Writes ``views`` back to back to ``fd`` at ``offset``: one ``pwritev`` for many ranges (up
    to ``_WRITE_CHUNK`` bytes per call, so no call asks the kernel for more), resumed after a
    short write. Returns the bytes written."""
    pending = [view.cast("B") if view.format != "B" or view.ndim != 1 else view for view in views]
    total = sum(len(view) for view in pending)
    done = 0
    while pending:
        call, size = [], 0
        for view in pending:
            if size + len(view) > _WRITE_CHUNK:
                if size < _WRITE_CHUNK:
                    call.append(view[: _WRITE_CHUNK - size])
                break
            call.append(view)
            size += len(view)
        written = os.pwritev(fd, call, offset + done)
        done += written
        while pending and written >= len(pending[0]):
            written -= len(pending.pop(0))
        if pending and written:
            pending[0] = pending[0][written:]
    return total


def safetensors_header(entries: Iterable[tuple[str, torch.dtype, tuple[int, ...], int]], *, residue: int = 0) -> bytes:
    """Builds a safetensors header (8-byte length + JSON) for tensors written back to back.

    Args:
        entries: ``(name, dtype, shape, nbytes)`` in the order their bytes follow the header.
        residue: The tensor data starts this many bytes past a page boundary.

    Returns:
        The bytes that precede the tensor data.
    """
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape, nbytes in entries:
        if dtype not in _SAFETENSORS_DTYPES:
            raise TypeError(f"dtype {dtype} of tensor {name!r} has no safetensors code")
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    # The format allows padding the header with spaces (the safetensors library pads to 8): the
    # data starts where the planner asks, so that tensors can be written straight from memory.
    encoded += b" " * ((residue - 8 - len(encoded)) % 4096)
    return len(encoded).to_bytes(8, "little") + encoded


def write_manifest(directory: Path, manifest: dict[str, object]) -> None:
    write_bytes_durably(directory / MANIFEST_NAME, json.dumps(manifest, indent=1, sort_keys=True).encode())


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest's JSON object (its values as JSON gives them: the reader checks them)."""
    manifest: dict[str, Any] = json.loads((directory / MANIFEST_NAME).read_text())
    return manifest


def commit(root: Path, step: int) -> Path:
    """Renames ``checkpoint-<step>.tmp`` into place and moves ``latest`` to it (steps 4 and 5).

    Returns:
        The committed directory.

    Raises:
        CheckpointError: A later attempt of the job owns its output (the platform's fence,
            ``_layout.superseded_by``): nothing is renamed.
    """
    source, target = tmp_dir(root, step), committed_dir(root, step)
    fenced = superseded_message(f"commits no checkpoint; step {step} is discarded")
    if fenced:
        raise CheckpointError(fenced)
    fsync_path(source)
    if root not in _parents_synced:
        # ``concurrent_checkpoint/`` itself was created by this run's first save: its entry
        # in the output directory must be durable before anything under it counts.
        fsync_path(root.parent)
        _parents_synced.add(root)
    os.replace(source, target)
    try:
        fsync_path(root)
        marker_tmp = root / f"{LATEST_NAME}{TMP_SUFFIX}"
        write_bytes_durably(marker_tmp, f"{step}\n".encode())
        os.replace(marker_tmp, root / LATEST_NAME)
        fsync_path(root)
    except BaseException:
        # Reported failed, so it must not stay selectable: back to its temporary name (which
        # the caller removes, as is any .tmp at the next start).
        os.replace(target, source)
        fsync_path(root)
        raise
    return target


_parents_synced: set[Path] = set()


def remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def remove_stale_tmp_dirs(root: Path) -> None:
    """Removes what a crashed run left half-written: ``.tmp`` dirs, ``latest.tmp``, rotations.

    Called by rank 0 before any save of this run.
    """
    if not root.is_dir():
        return
    for entry in os.scandir(root):
        partial_checkpoint = entry.name.startswith(CHECKPOINT_PREFIX) and entry.name.endswith(TMP_SUFFIX)
        if partial_checkpoint or entry.name.startswith(".deleting-"):
            logger.info("[Concurrent Checkpoint] removing partial checkpoint %s", entry.path)
            remove_tree(Path(entry.path))
        elif entry.name == f"{LATEST_NAME}{TMP_SUFFIX}":
            Path(entry.path).unlink(missing_ok=True)


def rotate(root: Path, *, keep: int, protect: Iterable[Path] = ()) -> list[int]:
    """Deletes the oldest committed checkpoints so that at most ``keep`` remain.

    Only committed dirs are candidates, never a ``.tmp`` one, never the newest, never ``protect``.

    Returns:
        The steps removed.
    """
    fenced = superseded_message("rotates nothing out")
    if fenced:
        logger.warning("%s", fenced)
        return []
    steps = committed_steps(root)
    protected = {Path(p).resolve() for p in protect}
    newest = read_latest(root)
    removed = []
    for step in steps[: max(0, len(steps) - keep)]:
        path = committed_dir(root, step)
        if step == newest or path.resolve() in protected:
            continue
        # Rename first so a reader never sees a half-deleted committed dir.
        doomed = root / f".deleting-{step}"
        os.replace(path, doomed)
        remove_tree(doomed)
        removed.append(step)
    if removed:
        fsync_path(root)  # the renames and removals are entries of root
    return removed
