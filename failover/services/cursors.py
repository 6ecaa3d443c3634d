"""Where the health monitor stopped reading each node's kernel evidence, kept in the database
(:class:`~failover.models.EvidenceCursor`), so that a console started again after an outage reads
exactly what was written while none was reading, once: never nothing (an Xid written while the
console was down would never drain its node nor fail its job over), never twice (a record already
counted must not stop a run or fail a job over again).

A position is read once, when the monitor first reads a node, and written only when it moved,
after the events read up to it are stored (a quiet pass makes no query). A position in another
file than the one there now (the node's file rotated, the machine rebooted: ``file`` differs) or
past its end (truncated) means nothing: that file is read from its start.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

from django.utils import timezone

from failover.kmsg import boot_time
from failover.models import EvidenceCursor
from jobs.models import Node

BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class Position:
    file: str  # which file (or, for /dev/kmsg, which boot) the position is in
    offset: int  # bytes read (a node check's file), or the last kernel record's sequence number


def boot_id() -> str:
    try:
        with open(BOOT_ID) as fh:
            return fh.read().strip()[:40]
    except OSError:
        return f"{boot_time():.0f}"  # no /proc: the boot's time, to the second


def file_identity(status: os.stat_result) -> str:
    """Which file a position is in: the boot for a character device (``/dev/kmsg``'s sequence
    numbers start again at each boot), else the file's device and inode."""
    if stat.S_ISCHR(status.st_mode):
        return f"boot:{boot_id()}"
    return f"{status.st_dev}:{status.st_ino}"


def path_identity(path: str) -> str:
    """``file_identity`` of a path ("" where it cannot be read: no position is kept then)."""
    try:
        return file_identity(os.stat(path))
    except OSError:
        return ""


class Cursors:
    """One monitor's positions of one ``source``, by node name."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.saved: dict[str, Position] = {}  # as stored (read at the node's first pass, then as written)
        self.loaded: set[str] = set()
        self.moved: dict[str, Position] = {}  # read to here, not stored yet

    def load(self, nodes: list[Node]) -> None:
        """The stored positions of the nodes not read yet (one query, at their first pass)."""
        fresh = [node for node in nodes if node.name not in self.loaded]
        if not fresh:
            return
        rows = EvidenceCursor.objects.filter(node__in=fresh, source=self.source).values_list("node__name", "file", "position")
        for name, file, position in rows:
            self.saved[name] = Position(file, position)
        self.loaded.update(node.name for node in fresh)

    def resumed(self, name: str, file: str) -> Position | None:
        """The stored position of ``name`` in ``file`` (None: none, or one in another file)."""
        position = self.saved.get(name)
        return position if position is not None and position.file == file and file else None

    def advance(self, name: str, position: Position) -> None:
        if position != self.saved.get(name):
            self.moved[name] = position

    def to_save(self, node: Node) -> bool:
        """Whether the node was read past its stored position (``save`` has something to write)."""
        position = self.moved.get(node.name)
        return position is not None and position != self.saved.get(node.name)

    def save(self, node: Node) -> None:
        """Store where the node was read to (after its events were stored)."""
        if not self.to_save(node):
            return
        position = self.moved[node.name]
        values = {"file": position.file, "position": position.offset, "read_at": timezone.now()}
        EvidenceCursor.objects.update_or_create(node=node, source=self.source, defaults=values)
        self.saved[node.name] = position
        del self.moved[node.name]  # a refused write keeps it, stored with the next pass's events
