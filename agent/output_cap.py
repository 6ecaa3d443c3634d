"""Where a run's output file stops growing, and what of a run's end it keeps: the runner's log cap
(``agent.runner``; standard library only, no Django).

The file keeps the command's first lines, up to ``max_lines`` lines (LOG_MAX_LINES_PER_JOB; the
platform's own lines are not counted) or ``max_bytes`` bytes of the file (LOG_MAX_BYTES_PER_JOB:
records whole, so a line that would cross the cap is the first one held back), whichever comes
first; 0: no such cap. Past it every line still takes its number, in order, and goes into the
*tail*: the last ``tail_lines`` lines read (the spec's, LOG_TAIL_LINES; at most ``TAIL_MAX_BYTES``
characters, and at most the byte cap's), held in memory and written when the run's output is
closed (a run killed by a signal included: the runner outlives it), after one marker line that
says how many lines were dropped between what was written and them. So the file stays bounded
whatever a run prints (its head, at most as much again written early, then the tail) and the
run's end (the traceback, the last checkpoint, a fatal GPU error) is in it; only a runner killed
outright (its node lost) loses its tail.

A line leaves the tail early, oldest first, in two ways, and is then written (its number in order)
or dropped:

* pushed out by newer lines: written when progress or checkpoints are read from it (up to
  ``PROGRESS_LINE_MAX_CHARS`` long), up to twice each cap, else dropped;
* held ``TAIL_HOLD_SECONDS``: written, whatever it says, up to one and a half times each cap (a
  run printing slowly past its cap is followed live, its progress with it); past that it stays
  in the tail until pushed out.

The database keeps its own rolling window of each stream's last lines (``logs.services``), so
what is written early is what its log shows until later lines take its place.
"""

from __future__ import annotations

import time
from collections import deque

from agent.runfiles import OutputWriter, output_record
from logs.progress_parser import may_tell

# Past the log cap only lines up to this long are read for progress and checkpoints (a commit
# line with its path fits): longer ones are not written before the run ends.
PROGRESS_LINE_MAX_CHARS = 4096
# A line past the cap is written after at most this long in the tail (while the budget lasts).
TAIL_HOLD_SECONDS = 10.0
# The tail's text held at most (the runner's memory), whatever ``tail_lines`` says; each line
# counts its characters and ``HELD_OVERHEAD``.
TAIL_MAX_BYTES = 16 << 20
HELD_OVERHEAD = 64


def size_text(count: int) -> str:
    """A byte count as the marker lines say it: whole MiB or KiB where it is one, else bytes."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift and count % (1 << shift) == 0:
            return f"{count >> shift:,} {unit}"
    return f"{count:,} bytes"


def tells(text: str) -> bool:
    """Whether progress or checkpoints may be read from a line (``logs.progress_parser``)."""
    return len(text) <= PROGRESS_LINE_MAX_CHARS and may_tell(text)


class OutputCap:
    """The caps of one run's output file, writing through ``out`` (see the module's docstring):
    ``take`` each line of the command, ``flush`` before waiting for more, ``finish`` once the
    command's output is closed."""

    def __init__(self, out: OutputWriter, max_lines: int, max_bytes: int, tail_lines: int = 10_000) -> None:
        self.out = out
        self.max_lines, self.max_bytes, self.tail_lines = max_lines, max_bytes, max(tail_lines, 0)
        self.tail_bytes = min(TAIL_MAX_BYTES, max_bytes) if max_bytes else TAIL_MAX_BYTES
        self.kept = 0  # the command's lines written: the head, then those written past it
        self.reached = ""  # which cap was reached, as the marker line says it; "" not yet
        self.setting = ""
        # The lines held: (number, time, text), oldest first (plain tuples: a flood makes one a line).
        self.tail: deque[tuple[int, float, str]] = deque()
        self.held_bytes = 0
        self.written = 0  # the number of the last line written
        self.dropped = 0  # lines past the cap never written
        self.aging = True  # held lines are still written after TAIL_HOLD_SECONDS (budget left)
        self.progress = True  # progress lines pushed out may still be written (twice the line cap not reached)

    def take(self, text: str, now: float) -> None:
        """The command's next line: written (the head), or held in the tail."""
        out = self.out
        if not self.reached:
            record = out.next_record(text, now)
            if self.max_lines and self.kept >= self.max_lines:
                self.reached, self.setting = f"the log cap of {self.max_lines:,} lines", "LOG_MAX_LINES_PER_JOB"
            elif self.max_bytes and out.bytes + len(record) > self.max_bytes:
                self.reached, self.setting = f"the output cap of {size_text(self.max_bytes)}", "LOG_MAX_BYTES_PER_JOB"
            else:
                out.append(record)
                self.kept += 1
                return
            self.written = out.count
        out.count += 1  # ``out.skip()``: the line's number is taken now; its record is made when written
        tail = self.tail
        tail.append((out.count, now, text))
        held = self.held_bytes + len(text) + HELD_OVERHEAD
        # A flood past the cap comes through here for every line: the oldest is pushed out inline,
        # and read for progress only while progress lines may still be written.
        while len(tail) > self.tail_lines or held > self.tail_bytes:
            number, at, oldest = tail.popleft()
            held -= len(oldest) + HELD_OVERHEAD
            if self.progress and len(oldest) <= PROGRESS_LINE_MAX_CHARS and may_tell(oldest):
                self.push_out(number, at, oldest)
            else:
                self.dropped += 1
        self.held_bytes = held
        if self.aging and tail and tail[0][1] <= now - TAIL_HOLD_SECONDS:
            self.age(now)

    def pop(self) -> tuple[int, float, str]:
        held = self.tail.popleft()
        self.held_bytes -= len(held[2]) + HELD_OVERHEAD
        return held

    def room(self, record: bytes, fraction: float) -> bool:
        """Whether one more line past the cap (``record``) stays within ``fraction`` × each cap."""
        if self.max_lines and self.kept >= fraction * self.max_lines:
            return False
        return not (self.max_bytes and self.out.bytes + len(record) > fraction * self.max_bytes)

    def write(self, number: int, record: bytes) -> None:
        self.out.write(record)
        self.kept += 1
        self.written = number
        self.progress = not (self.max_lines and self.kept >= 2 * self.max_lines)

    def push_out(self, number: int, at: float, text: str) -> None:
        """A progress or checkpoint line pushed out of the tail by newer ones: written, up to
        twice each cap, else dropped (other lines pushed out are dropped)."""
        record = output_record(number, at, text)
        if self.room(record, 2.0):
            self.write(number, record)
        else:
            self.dropped += 1
            self.progress = not (self.max_lines and self.kept >= 2 * self.max_lines)

    def age(self, now: float) -> None:
        """Write the lines held ``TAIL_HOLD_SECONDS`` (up to one and a half times each cap, twice
        for progress lines); once that budget is spent, held lines stay until pushed out."""
        while self.aging and self.tail and self.tail[0][1] <= now - TAIL_HOLD_SECONDS:
            number, at, text = self.tail[0]
            record = output_record(number, at, text)
            if not self.room(record, 2.0 if tells(text) else 1.5):
                self.aging = False
                return
            self.pop()
            self.write(number, record)

    def flush(self, now: float | None = None) -> float | None:
        """Before the runner waits for more output: what is due is written; returns how long it
        may wait before calling again (None: as long as it likes)."""
        now = time.time() if now is None else now
        self.age(now)
        self.out.flush()
        if not self.aging or not self.tail:
            return None
        return max(self.tail[0][1] + TAIL_HOLD_SECONDS - now, 0.01)

    def finish(self, now: float) -> None:
        """The command's output is closed: the marker (where lines were dropped) and the tail."""
        if not self.reached:
            return
        first = self.tail[0][0] if self.tail else self.out.count + 1
        gap = first - 1 - self.written
        if gap > 0:
            # Numbered as the first line it stands for: numbers stay in order and a reader counts
            # the lines it replaces from there up to the next record.
            self.out.write(output_record(self.written + 1, now, self.marker(gap)))
        while self.tail:
            number, at, text = self.pop()
            self.write(number, output_record(number, at, text))
        self.out.flush()

    def marker(self, gap: int) -> str:
        """The line before the tail: how many lines were dropped there (and in all, where more)."""
        more = f", {self.dropped:,} in all" if self.dropped != gap else ""
        return (
            f"[log cap] {gap:,} line{'' if gap == 1 else 's'} of this run dropped here{more} (past {self.reached}, {self.setting}, "
            f"the runner keeps progress and checkpoint lines and the last {self.tail_lines:,}, LOG_TAIL_LINES); the last {len(self.tail):,} follow"
        )
