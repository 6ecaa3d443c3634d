"""Reading what runs print: the runner's ``output.jsonl`` records, parsed with limits and handed
to the log ingest in batches. The file is written by the job's own supervisor, so every record is
untrusted; a bad one is skipped and costs only itself."""
from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from pathlib import Path

from jobs.models import AttemptNode
from logs.services import RawLine, ingest_lines

logger = logging.getLogger(__name__)

INGEST_BATCH = 5000
# At most this much of one run's output per round, so one chatty run never starves the others,
# nor the heartbeat (which would get the node taken as lost).
DRAIN_MAX_BYTES = 4 << 20


class OutputReader:
    """Per agent: how far each run's output has been ingested."""

    def __init__(self) -> None:
        self.offsets: dict[int, int] = {}  # AttemptNode id → bytes of output.jsonl ingested

    def forget(self, part_id: int) -> None:
        self.offsets.pop(part_id, None)

    def drain(self, part: AttemptNode, directory: Path) -> bool:
        """Ingest the run's next output lines; True once everything written so far is stored."""
        path = directory / "output.jsonl"
        offset = self.offsets.get(part.pk, 0)
        try:
            with open(path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read(DRAIN_MAX_BYTES)
                at_end = len(chunk) < DRAIN_MAX_BYTES or not fh.read(1)
        except FileNotFoundError:
            return True
        end = chunk.rfind(b"\n")
        if end < 0:
            return at_end
        records = chunk[: end + 1].splitlines()
        try:
            # One parse for the whole slice; the runner writes one JSON object per line.
            parsed = json.loads(b"[" + b",".join(records) + b"]")
        except (ValueError, RecursionError):
            parsed = [parse_record(raw, part) for raw in records]
        lines = []
        for rec in parsed:
            line = checked_line(rec)
            if line is None:
                logger.warning("job %s: skipped an unreadable output record", part.attempt.job_id)
            else:
                lines.append(line)
        for start in range(0, len(lines), INGEST_BATCH):
            ingest_lines(job_id=part.attempt.job_id, stream=part.stream, attempt=part.attempt.number, lines=lines[start : start + INGEST_BATCH])
        self.offsets[part.pk] = offset + end + 1
        return at_end and end + 1 == len(chunk)


# What a record may hold: a line number a database column takes, a time from 1970 to 2200.
MAX_LINE_NO = 2**62
MAX_TIMESTAMP = 7_258_118_400.0


def checked_line(rec: object) -> RawLine | None:
    """The line a record stands for, or None when any field is missing or out of range."""
    if not isinstance(rec, dict):
        return None
    number, stamp, text = rec.get("n"), rec.get("t"), rec.get("s")
    if isinstance(number, bool) or not isinstance(number, int) or not 0 < number < MAX_LINE_NO:
        return None
    if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not 0 <= stamp < MAX_TIMESTAMP:
        return None
    if not isinstance(text, str):
        return None
    return RawLine(number, datetime.fromtimestamp(stamp, tz=UTC), text)


def parse_record(raw: bytes, part: AttemptNode) -> dict | None:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        logger.warning("job %s: skipped an unreadable output record", part.attempt.job_id)
        return None
