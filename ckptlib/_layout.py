"""Where checkpoints live and which are committed: the layout readers need, standard library
only, so a process that only looks for the latest checkpoint (the console, placing a resumed run)
never imports torch. The commit protocol that produces this layout is in ``_format``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

CHECKPOINT_SUBDIR = "concurrent_checkpoint"
CHECKPOINT_PREFIX = "checkpoint-"
TMP_SUFFIX = ".tmp"
LATEST_NAME = "latest"
MANIFEST_NAME = "ckptlib.json"

_COMMITTED_RE = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_root(output_dir: str | os.PathLike[str]) -> Path:
    """Returns ``<output_dir>/concurrent_checkpoint``."""
    return Path(output_dir) / CHECKPOINT_SUBDIR


def committed_dir(root: Path, step: int) -> Path:
    return root / f"{CHECKPOINT_PREFIX}{step}"


def tmp_dir(root: Path, step: int) -> Path:
    return root / f"{CHECKPOINT_PREFIX}{step}{TMP_SUFFIX}"


def committed_steps(root: Path) -> list[int]:
    """Steps of the committed checkpoints under ``root``, ascending. Temporary dirs never count."""
    if not root.is_dir():
        return []
    steps = []
    for entry in os.scandir(root):
        match = _COMMITTED_RE.match(entry.name)
        if match and entry.is_dir() and (Path(entry.path) / MANIFEST_NAME).is_file():
            steps.append(int(match.group(1)))
    return sorted(steps)


def read_latest(root: Path) -> int | None:
    """The newest committed step: the ``latest`` marker if it names a whole checkpoint, else a listing."""
    steps = committed_steps(root)
    try:
        marked = int((root / LATEST_NAME).read_text().strip())
    except (OSError, ValueError):
        marked = None
    if marked is not None and marked in steps and marked == max(steps):
        return marked
    # The marker lags by at most one rename (crash between commit steps 4 and 5) or is missing.
    return steps[-1] if steps else None
