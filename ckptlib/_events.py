"""The one console line logged per committed checkpoint, written and read back.

``CommitEvent`` is what the line carries: ``CommitEvent.log_line`` writes it, ``parse_commit_line``
reads it back (the console does, from job logs, without torch). Standard library only.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass

logger = logging.getLogger(__name__)

LOG_PREFIX = "[Concurrent Checkpoint]"

#: Matches the line logged once per committed checkpoint, anywhere in a log line (the logging
#: handler may put a timestamp and level in front of it).
COMMIT_LINE_RE = re.compile(
    r"\[Concurrent Checkpoint\] committed step=(?P<step>\d+) bytes=(?P<bytes>\d+)"
    r" blocking_s=(?P<blocking_s>\d+\.\d+) persist_s=(?P<persist_s>\d+\.\d+) path=(?P<path>\S.*)$"
)


@dataclass(frozen=True)
class CommitEvent:
    """A committed checkpoint as its commit line tells it (one rank's part).

    Attributes:
        step: The training step saved.
        bytes: Bytes the logging rank wrote.
        blocking_s: Seconds the training loop waited for it.
        persist_s: Seconds from the ``save`` call until it was committed.
        path: The committed directory.
    """

    step: int
    bytes: int
    blocking_s: float
    persist_s: float
    path: str

    def log_line(self) -> str:
        """The console line (see ``COMMIT_LINE_RE``)."""
        return f"{LOG_PREFIX} committed step={self.step} bytes={self.bytes} blocking_s={self.blocking_s:.6f} persist_s={self.persist_s:.6f} path={self.path}"


def parse_commit_line(line: str) -> CommitEvent | None:
    """Parses a console line logged for a committed checkpoint.

    Args:
        line: Any log line.

    Returns:
        The event, or None when the line is not a commit line.
    """
    match = COMMIT_LINE_RE.search(line.rstrip("\n"))
    if match is None:
        return None
    return CommitEvent(
        step=int(match["step"]),
        bytes=int(match["bytes"]),
        blocking_s=float(match["blocking_s"]),
        persist_s=float(match["persist_s"]),
        path=match["path"],
    )


def install_console_handler() -> None:
    """Sends ckptlib's INFO lines to stderr, formatted like the service's sidecar, once.

    The job log is what the console shows, so commit lines must reach it even when the training
    script never configures logging.
    """
    package_logger = logging.getLogger("ckptlib")
    if any(getattr(h, "_ckptlib_console", False) for h in package_logger.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler._ckptlib_console = True  # type: ignore[attr-defined]
    handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] %(message)s"))
    package_logger.addHandler(handler)
    package_logger.setLevel(logging.INFO)
    package_logger.propagate = False
