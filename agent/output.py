"""Reading what runs print: the runner's output records (``agent.runfiles.read_output``, parsed
with limits) handed to the log ingest in batches. The records are written by the job's own
supervisor, so every one is untrusted; a bad one is skipped and costs only itself."""
from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

from agent import runfiles
from jobs.models import AttemptNode
from logs.services import RawLine, ingest_lines

logger = logging.getLogger(__name__)

INGEST_BATCH = 5000


class OutputReader:
    """Per agent: how far each run's output has been ingested."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}  # AttemptNode id → bytes of the run's output ingested

    def forget(self, part_id: int) -> None:
        self.offsets.pop(part_id, None)

    def drain(self, part: AttemptNode, directory: Path, *, complete: bool = False) -> bool:
        """Ingest the run's next output lines; True once everything written so far is stored.
        ``complete``: the run has ended (its exit record is written), so its output is whole."""
        chunk = runfiles.read_output(directory, self.offsets.get(part.pk, 0), complete=complete)
        if chunk.unreadable:
            logger.warning("job %s: skipped %s unreadable output record(s)", part.attempt.job_id, chunk.unreadable)
        lines = [raw_line(line) for line in chunk.lines]
        for start in range(0, len(lines), INGEST_BATCH):
            ingest_lines(job_id=part.attempt.job_id, stream=part.stream, attempt=part.attempt.number, lines=lines[start : start + INGEST_BATCH])
        self.offsets[part.pk] = chunk.offset
        return chunk.at_end


def raw_line(line: runfiles.OutputLine) -> RawLine:
    return RawLine(line.number, datetime.fromtimestamp(line.time, tz=UTC), line.text)


def checked_line(record: object) -> RawLine | None:
    """The line a parsed output record stands for, or None when any field is missing or out of
    range (``agent.runfiles.checked_record``)."""
    line = runfiles.checked_record(record)
    return None if line is None else raw_line(line)
