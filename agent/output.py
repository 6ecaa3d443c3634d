"""Reading what runs print: the runner's output records (``agent.runfiles.read_output``, parsed
with limits) handed to the log ingest in batches. The records are written by the job's own
supervisor, so every one is untrusted; a bad one is skipped and costs only itself.

Fair under floods: each round gives each run a turn of ``OUTPUT_TURN_SECONDS`` (read and stored
in slices of ``READ_SLICE`` bytes and at most ``SLICE_LINES`` lines), so a run printing a million
lines waits its turn like the others; the runs still behind after their turn are in ``behind``
(the agent then starts its next round at once), and between two of their turns the agent stores
what the other runs printed meanwhile (``NodeAgent.collect``), so a quiet run's lines wait for at
most one flood's turn, however many runs flood."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from django.conf import settings

from agent import runfiles
from jobs.models import AttemptNode
from logs.services import RawLine, ingest_lines

logger = logging.getLogger(__name__)

INGEST_BATCH = 5000
READ_SLICE = 256 << 10  # bytes of output records read and stored at a time: about 2,000 lines of 100 characters
SLICE_LINES = 2000  # and at most this many lines (a flood of short lines)


class OutputReader:
    """Per agent: how far each run's output has been ingested."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}  # AttemptNode id → bytes of the run's output ingested
        self.behind: set[int] = set()  # AttemptNode ids with output left after their turn

    def forget(self, part_id: int) -> None:
        self.offsets.pop(part_id, None)
        self.behind.discard(part_id)

    def drain(self, part: AttemptNode, directory: Path, *, complete: bool = False) -> bool:
        """Ingest the run's next output lines, one turn of them; True once everything written so
        far is stored. ``complete``: the run has ended (its exit record is written), so its
        output is whole."""
        turn_ends = time.monotonic() + settings.OUTPUT_TURN_SECONDS
        while True:
            at_end = self.drain_slice(part, directory, complete=complete)
            if at_end or time.monotonic() >= turn_ends:
                break
        if at_end:
            self.behind.discard(part.pk)
        else:
            self.behind.add(part.pk)
        return at_end

    def printed_since(self, part: AttemptNode, directory: Path) -> bool:
        """Whether the run's output grew past what was ingested (one ``lstat``, no read)."""
        return runfiles.output_size(directory) > self.offsets.get(part.pk, 0)

    def drain_slice(self, part: AttemptNode, directory: Path, *, complete: bool) -> bool:
        offset = self.offsets.get(part.pk, 0)
        # A part the control plane closed while its agent was away (a lost node's stray run):
        # its lines are late, each ingest of them moves the next attempt's lines up to make room
        # (``logs.services.make_room``), so they go in as few, large batches.
        late = part.ended_at is not None
        piece = runfiles.OUTPUT_READ_MAX_BYTES if late else min(READ_SLICE, runfiles.OUTPUT_READ_MAX_BYTES)
        chunk = runfiles.read_output(directory, offset, complete=complete, max_bytes=piece, max_lines=None if late else SLICE_LINES)
        if not chunk.lines and chunk.unreadable and piece < runfiles.OUTPUT_READ_MAX_BYTES:
            # One record longer than a slice (a long line, escaped): read it whole.
            chunk = runfiles.read_output(directory, offset, complete=complete)
        if chunk.unreadable:
            logger.warning("job %s: skipped %s unreadable output record(s)", part.attempt.job_id, chunk.unreadable)
        lines = list(map(raw_line, chunk.lines))
        batch = max(len(lines), 1) if late else INGEST_BATCH
        for start in range(0, len(lines), batch):
            ingest_lines(job_id=part.attempt.job_id, stream=part.stream, attempt=part.attempt.number, lines=lines[start : start + batch])
        self.offsets[part.pk] = chunk.offset
        return chunk.at_end


def raw_line(line: runfiles.OutputLine) -> RawLine:
    # Field for field (the unix time as the runner recorded it: ingest writes its text without
    # making a datetime a line).
    return RawLine._make(line)


def checked_line(record: object) -> RawLine | None:
    """The line a parsed output record stands for, or None when any field is missing or out of
    range (``agent.runfiles.checked_record``)."""
    line = runfiles.checked_record(record)
    return None if line is None else raw_line(line)
