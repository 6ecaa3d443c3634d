"""What the checkpoint engine hands back: a checkpoint's result, one read back, and its error.

Standard library only (the commit line's format comes from ``ckptlib._events``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptlib._events import CommitEvent


class CheckpointError(RuntimeError):
    """A checkpoint could not be found, read or written."""


@dataclass(frozen=True)
class CheckpointResult:
    """What happened to one checkpoint of this process.

    Attributes:
        step: The training step saved.
        path: The committed directory (or the one it would have been).
        bytes: Bytes this rank wrote.
        blocking_s: Seconds the training loop waited: inside ``save`` plus optimizer steps held
            back until staging finished.
        persist_s: Seconds from the ``save`` call until the checkpoint was committed.
        committed: Whether the checkpoint reached disk whole and became selectable.
        error: Why it was not committed, when it was not.
    """

    step: int
    path: str
    bytes: int
    blocking_s: float
    persist_s: float
    committed: bool
    error: str | None = None

    def log_line(self) -> str:
        """The console line for a committed checkpoint (see ``COMMIT_LINE_RE``)."""
        return CommitEvent(step=self.step, bytes=self.bytes, blocking_s=self.blocking_s, persist_s=self.persist_s, path=self.path).log_line()


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint read back by ``CheckpointEngine.load``.

    Attributes:
        step: The step it was saved at.
        path: Its committed directory.
        state: Key → loaded object (state dicts, ``rng_state``), as given to ``save``.
    """

    step: int
    path: Path
    state: dict[str, Any]
