"""The unprivileged uid each project's runs get on a node, taken from a range an operator sets
(``JOB_UID_RANGE``) and recorded in one file for the whole node (``JOB_UID_REGISTRY``), so two
consoles on one node never hand the same uid to two projects.

Standard library only. The file maps ``<install id>/<project id>`` to a uid, under an exclusive
``flock``; an install's id is random, made once in its ``var/`` directory.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
from pathlib import Path


class NoFreeUid(RuntimeError):
    """Every uid of the range is taken."""


def install_id(var_dir: Path) -> str:
    """This console's id on shared nodes (made on first use)."""
    path = Path(var_dir) / "install-id"
    try:
        value = path.read_text().strip()
        if value:
            return value
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    value = secrets.token_hex(8)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
    return value


def parse_range(text: str) -> tuple[int, int]:
    low, _, high = text.partition("-")
    first, last = int(low), int(high)
    if not 1000 <= first <= last < 2**31:
        raise ValueError(f"JOB_UID_RANGE {text!r}: use FIRST-LAST, both from 1000 up")
    return first, last


def uid_for(registry: Path, install: str, project_id: int, uid_range: str) -> int:
    """The uid of ``project_id``'s runs for this install: the one recorded, or the lowest free
    uid of the range, recorded now."""
    first, last = parse_range(uid_range)
    key = f"{install}/{project_id}"
    registry = Path(registry)
    registry.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(registry, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "r+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            taken = json.loads(fh.read() or "{}")
        except ValueError:
            taken = {}
        if not isinstance(taken, dict):
            taken = {}
        uid = taken.get(key)
        if isinstance(uid, int) and first <= uid <= last:
            return uid
        used = {v for v in taken.values() if isinstance(v, int)}
        uid = next((u for u in range(first, last + 1) if u not in used), None)
        if uid is None:
            raise NoFreeUid(f"every uid of JOB_UID_RANGE {uid_range} is taken ({registry})")
        taken[key] = uid
        fh.seek(0)
        fh.truncate()
        json.dump(taken, fh, indent=0, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
        return uid
