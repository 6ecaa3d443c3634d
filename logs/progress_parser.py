"""Training progress read from log lines: a pure parser, no database.

What a line can tell:

* the Hugging Face Trainer's log dict: ``{'loss': 2.1, 'grad_norm': 1.3, 'learning_rate': 5e-05, 'epoch': 0.5}``;
* a tqdm bar (the Trainer's among them): `` 12%|█▏        | 12/100 [00:03<00:20,  4.31it/s]``;
* our example scripts: ``epoch 1/3 step 50/150 loss 0.036 lr 0.01``, ``step 12/400 loss 0.123``,
  ``step 12 loss 0.1234``; ``key=value`` spellings (``step=12 loss=0.5``) too;
* ckptlib's commit line (``[Concurrent Checkpoint] committed step=… bytes=…``): a checkpoint, and
  the step it saved; its Trainer step line (``[Concurrent Checkpoint] trainer step=12/200
  epoch=0.24``), logged just before each of the Trainer's log dicts: the Trainer's own
  ``global_step/max_steps``.

Not every bar is training: a bar with a description (``Map:``, ``Writing model shards:``,
``Loading weights:``) prepares data or a model, and a nested bar (drawn below another and moved back
up with ``ESC[A``, as the Trainer's evaluation bar is) measures something inside the training; neither
says how far training is.

``parse_line`` reads one line; ``fold_lines`` folds a batch into the latest progress, the loss
curve's points and the checkpoints, in one pass.

A line is untrusted text: what it tells is taken only in range (a step, a total or a byte count
below ``MAX_COUNT``, finite numbers), a commit line with a value out of range is no checkpoint,
and a line the parser cannot read says nothing. So a forged line costs only itself, never its
batch's other lines, progress or checkpoints.
"""

from __future__ import annotations

import ast
import math
import re
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import accumulate
from typing import TypeVar

from ckptlib import CommitEvent, parse_commit_line

NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
# A cheap test that skips most lines before any of the patterns below runs.
INTERESTING = re.compile(r"step|loss|epoch|learning_rate|\blr\b|\d/\d+ ?\[|Concurrent Checkpoint", re.IGNORECASE)
# INTERESTING's words, tested as lower-case substrings (``may_tell``); and its other two parts.
WORDS = ("step", "loss", "epoch", "learning_rate", "concurrent checkpoint")
LR_WORD = re.compile(r"\blr\b")
FRACTION_BAR = re.compile(r"\d/\d+ ?\[")
# The same test as plain lower-case substrings, run over a whole batch at once (a superset).
KEYWORDS = ("step", "loss", "epoch", "learning_rate", "lr ", "lr=", "lr:", "it/s", "s/it", "%|", "[concurrent checkpoint]")
TRAINER_DICT = re.compile(r"\{'[a-z_]+': [^{}]*\}")
TQDM = re.compile(r"(?<![\d/.])(\d+)/(\d+) ?\[(?:\d+:)?\d+:\d+[^\]\r\n]*\]?")
# What precedes a bar's counts in its drawing: `` 12%|█▏        | `` (and a description before it).
BAR_HEAD = re.compile(r"\s*\d+%\|[^|]*\|\s*$")
# A bar's description that still says training (``Training:``, ``Epoch 1:``); others prepare data.
TRAINING_BAR = re.compile(r"\b(?:train(?:ing)?|epoch|steps?|iter(?:ation)?s?)\b", re.IGNORECASE)
PREPARING_BAR = re.compile(r"split|map|shard|download|load|generat|token|writ|sav|eval|predict|valid|test", re.IGNORECASE)
CURSOR_UP = "\x1b[A"
TRAINER_STEP = re.compile(rf"\[Concurrent Checkpoint\] trainer step=(\d+)/(\d+)(?: epoch=({NUMBER}))?")
STEP = re.compile(r"\b(?:global_)?step[ =:]+(\d+)(?:\s*/\s*(\d+))?\b", re.IGNORECASE)
EPOCH = re.compile(rf"\bepoch[ =:]+({NUMBER})(?:\s*/\s*(\d+))?", re.IGNORECASE)
LOSS = re.compile(rf"\b(?:train_)?loss[ =:]+({NUMBER}|nan|inf)\b", re.IGNORECASE)
LR = re.compile(rf"\b(?:lr|learning_rate)[ =:]+({NUMBER})", re.IGNORECASE)
MAX_DICT_CHARS = 2000
# Steps, totals and byte counts at or above this are not believed: 2**53, what the database's
# columns hold with room to add ranks up and what a browser shows exactly.
MAX_COUNT = 2**53
# What reading one line may raise on absurd input (more digits than int() takes, a float overflow).
UNREADABLE = (ValueError, ArithmeticError, RecursionError)


# A line's time: the parser only hands it back with what the line told.
TS = TypeVar("TS")


@dataclass(frozen=True)
class Progress:
    """What one line (or a batch, folded) says about training progress; None: not told."""

    step: int | None = None
    total: int | None = None
    epoch: float | None = None
    loss: float | None = None
    lr: float | None = None

    def merged(self, newer: Progress) -> Progress:
        """This progress updated by a later one: what the later one tells wins."""
        return Progress(
            step=newer.step if newer.step is not None else self.step,
            total=newer.total if newer.total is not None else self.total,
            epoch=newer.epoch if newer.epoch is not None else self.epoch,
            loss=newer.loss if newer.loss is not None else self.loss,
            lr=newer.lr if newer.lr is not None else self.lr,
        )

    @property
    def empty(self) -> bool:
        # Not ``self == Progress()``: that makes and compares a new object for every line read.
        return self.step is None and self.total is None and self.epoch is None and self.loss is None and self.lr is None


@dataclass(frozen=True)
class LineMetrics:
    progress: Progress | None = None
    checkpoint: CommitEvent | None = None
    # Every other number a Trainer log dict told (eval_loss, grad_norm, eval_accuracy …).
    values: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class MetricSample:
    """A point of the job's curves: at ``step`` (the latest step known when it was logged), its
    loss and learning rate and any other number the Trainer logged there (``values``)."""

    step: int
    epoch: float | None
    loss: float | None
    lr: float | None
    ts: datetime
    values: dict[str, float] = field(default_factory=dict)

    def merged(self, newer: MetricSample) -> MetricSample:
        """This step's point with what a later line of the same step told (an evaluation's
        eval_loss after the training loss): what the later one tells wins, nothing is lost."""
        return MetricSample(
            step=self.step,
            epoch=newer.epoch if newer.epoch is not None else self.epoch,
            loss=newer.loss if newer.loss is not None else self.loss,
            lr=newer.lr if newer.lr is not None else self.lr,
            ts=newer.ts,
            values={**self.values, **newer.values},
        )


@dataclass
class BatchMetrics:
    """A batch of lines folded: the progress after it, the loss samples and the checkpoints."""

    progress: Progress = field(default_factory=Progress)
    samples: list[MetricSample] = field(default_factory=list)
    checkpoints: list[tuple[CommitEvent, datetime]] = field(default_factory=list)
    changed: bool = False


def finite(raw: object) -> float | None:
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def count(raw: object) -> int | None:
    """A step, total or byte count in range (``0 <= n < MAX_COUNT``), from digits or an int; else None."""
    if isinstance(raw, str):
        if not raw.isdecimal() or len(raw) > 16:
            return None
        raw = int(raw)
    if not isinstance(raw, int) or isinstance(raw, bool):
        return None
    return raw if 0 <= raw < MAX_COUNT else None


def checked_commit(event: CommitEvent | None) -> CommitEvent | None:
    """A commit line's event when every value is in range, else None (no checkpoint)."""
    if event is None or count(event.step) is None or count(event.bytes) is None:
        return None
    if finite(event.blocking_s) is None or finite(event.persist_s) is None:
        return None
    return event


# The Trainer's own keys, read into progress; every other finite number is a metric of its own.
PROGRESS_KEYS = frozenset({"step", "epoch", "loss", "learning_rate"})
METRIC_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_./-]{0,63}$")
MAX_METRICS_PER_LINE = 32


def trainer_values(logged: dict) -> tuple[tuple[str, float], ...]:
    """The numbers of a Trainer log dict besides its progress keys: at most
    MAX_METRICS_PER_LINE, each named like a metric and finite (numbers or number strings)."""
    found = []
    for key, raw in logged.items():
        if key in PROGRESS_KEYS or not isinstance(key, str) or not METRIC_NAME.match(key) or isinstance(raw, bool):
            continue
        value = finite(raw) if isinstance(raw, (int, float, str)) else None
        if value is not None:
            found.append((key, value))
            if len(found) >= MAX_METRICS_PER_LINE:
                break
    return tuple(found)


def read_trainer_dict(text: str) -> LineMetrics | None:
    """The last Trainer log dict of the line: its progress and its other numbers."""
    match = None
    for match in TRAINER_DICT.finditer(text):  # noqa: B007 - keeps the last one
        pass
    if match is None or len(match.group(0)) > MAX_DICT_CHARS:
        return None
    try:
        logged = ast.literal_eval(match.group(0))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(logged, dict):
        return None
    progress = Progress(
        step=count(logged.get("step")),
        epoch=finite(logged.get("epoch")),
        loss=finite(logged.get("loss")),
        lr=finite(logged.get("learning_rate")),
    )
    values = trainer_values(logged)
    if progress.empty and not values:
        return None
    return LineMetrics(progress=progress, values=values)


def parse_words(text: str) -> Progress | None:
    """``epoch 1/3 step 50/150 loss 0.036 lr 0.01`` and its ``key=value`` spellings."""
    step = STEP.search(text)
    loss = LOSS.search(text)
    lr = LR.search(text)
    epoch = EPOCH.search(text)
    if not (step or loss or lr or epoch):
        return None
    progress = Progress(
        step=count(step.group(1)) if step else None,
        total=count(step.group(2)) if step and step.group(2) else None,
        epoch=finite(epoch.group(1)) if epoch else None,
        loss=finite(loss.group(1)) if loss else None,
        lr=finite(lr.group(1)) if lr else None,
    )
    return None if progress.empty else progress


def parse_tqdm(text: str) -> Progress | None:
    """The last drawing of a training bar in ``text`` (a bar redrawn with carriage returns may
    arrive as one line); data-preparation and nested bars are not training's."""
    found = None
    for drawing in re.split(r"[\r\n]", text):
        for match in TQDM.finditer(drawing):
            if is_training_bar(drawing, match):
                found = match
    if found is None:
        return None
    done, total = count(found.group(1)), count(found.group(2))
    if done is None or total is None or total <= 0 or done > total:
        return None
    return Progress(step=done, total=total)


def is_training_bar(drawing: str, match: re.Match[str]) -> bool:
    if drawing[match.end() :].startswith(CURSOR_UP):
        return False  # drawn below another bar: the Trainer's evaluation bar
    head = drawing[: match.start()]
    bar = BAR_HEAD.search(head)
    description = (head[: bar.start()] if bar else head).strip()
    if "]" in description:  # the end of something logged before the bar, not a description
        description = description.rsplit("]", 1)[1].strip()
    if not description:
        return True
    return TRAINING_BAR.search(description) is not None and PREPARING_BAR.search(description) is None


def may_tell(text: str) -> bool:
    """``INTERESTING.search(text)``, at C speed on a long line that tells nothing: substring
    searches first (the regex's case-blind alternation costs milliseconds on 16 KiB of text),
    a regex only where ``lr`` or a ``/`` and a ``[`` are in the line."""
    lowered = text.lower()
    if any(word in lowered for word in WORDS):
        return True
    if "lr" in lowered and LR_WORD.search(lowered):
        return True
    return "/" in text and "[" in text and FRACTION_BAR.search(text) is not None


def parse_line(text: str) -> LineMetrics | None:
    """What one log line says about progress or checkpoints; None when it says nothing."""
    if not INTERESTING.search(text):
        return None
    return parse_candidate(text)


def parse_candidate(text: str) -> LineMetrics | None:
    """What a line that may tell something tells; None also when it cannot be read."""
    try:
        return read_candidate(text)
    except UNREADABLE:
        return None


def read_candidate(text: str) -> LineMetrics | None:
    if "[Concurrent Checkpoint]" in text:
        return read_ckptlib_line(text)
    if "{'" in text and (logged := read_trainer_dict(text)) is not None:
        return logged
    progress = parse_tqdm(text)
    if progress is None:
        progress = parse_words(text)
    return LineMetrics(progress=progress) if progress is not None else None


def read_ckptlib_line(text: str) -> LineMetrics | None:
    """A commit line (a checkpoint, and at least its step) or the Trainer step line; a bar
    redrawn before it on the same line counts too."""
    head, _, _ = text.partition("[Concurrent Checkpoint]")
    bar = parse_tqdm(head) if head else None
    event = checked_commit(parse_commit_line(text))
    if event is not None:
        return LineMetrics(progress=bar, checkpoint=event)
    step = TRAINER_STEP.search(text)
    if step is None:
        return LineMetrics(progress=bar) if bar is not None else None
    told = Progress(step=count(step.group(1)), total=count(step.group(2)), epoch=finite(step.group(3)) if step.group(3) else None)
    if told.total is not None and told.step is not None and told.step > told.total:
        return None
    return LineMetrics(progress=told) if not told.empty else None


def candidate_lines(texts: list[str], limit: int | None = None) -> list[int]:
    """Indexes of the lines that may tell progress: plain substring searches over the batch
    joined and lower-cased (C speed), not a Python call per line.

    With ``limit``, where more lines than that may tell, an even subset of about ``limit`` of them,
    every checkpoint line and the last few: the subset is taken from the keywords' positions, so
    a batch where every line is a candidate costs a few finds per line, never a Python step per
    line."""
    blob = "\n".join(texts)
    lowered = blob.lower()
    if len(lowered) != len(blob):  # a character whose lower case is longer: go line by line
        found = [i for i, text in enumerate(texts) if INTERESTING.search(text)]
        return found if limit is None or len(found) <= limit else subset(found, texts, limit)
    if limit is not None and len(texts) > 4 * limit:
        return sampled_candidates(texts, lowered, limit)
    positions: list[int] = []
    for keyword in KEYWORDS:
        at = lowered.find(keyword)
        while at != -1:
            positions.append(at)
            at = lowered.find(keyword, at + 1)
    if not positions:
        return []
    starts = list(accumulate(map((1).__add__, map(len, texts[:-1])), initial=0))  # each line and its newline
    if limit is not None and len(positions) > 2 * limit:
        positions.sort()
        stride = len(positions) / (2 * limit)
        sample = [positions[int(i * stride)] for i in range(2 * limit)] + positions[-10:]
        lines = {bisect_right(starts, at) - 1 for at in sample} | marked_lines(lowered, starts, texts)
        return subset(sorted(lines), texts, limit)
    found = sorted({bisect_right(starts, at) - 1 for at in positions})
    return found if limit is None or len(found) <= limit else subset(found, texts, limit)


CHECKPOINT_MARK = "[concurrent checkpoint]"
EVAL_MARK = "{'eval_"  # the Trainer's evaluation dict
# Lines never sampled away (lower case): a checkpoint's commit, and an evaluation's dict (a few a
# run, each the only point of its curve at its step).
KEPT_MARKS = (CHECKPOINT_MARK, EVAL_MARK)


LEAD_LINES = 2  # the lines before an evaluation's that tell progress, kept with it


def marked_lines(lowered: str, starts: list[int], texts: list[str]) -> set[int]:
    """The lines of the batch that hold one of KEPT_MARKS, and before an evaluation's dict the
    last LEAD_LINES that may tell progress (its step is the latest one known when it is read)."""
    lines: set[int] = set()
    for mark in KEPT_MARKS:
        at = lowered.find(mark)
        while at != -1:
            index = bisect_right(starts, at) - 1
            lines.add(index)
            if mark == EVAL_MARK:
                lines |= set(leading(texts, index))
            at = lowered.find(mark, at + 1)
    return lines


def leading(texts: list[str], index: int) -> list[int]:
    """The last LEAD_LINES lines before ``index`` (within 8) that may tell progress."""
    found = []
    for before in range(index - 1, max(index - 9, -1), -1):
        if may_tell(texts[before]):
            found.append(before)
            if len(found) == LEAD_LINES:
                break
    return found


def sampled_candidates(texts: list[str], lowered: str, limit: int) -> list[int]:
    """``candidate_lines`` for a batch of many more lines than ``limit`` (a flood): the first line
    that may tell in each of ``2 * limit`` equal stretches of the batch's text, every checkpoint
    line and the last ones, then ``subset``. A bounded ``find`` per keyword and stretch: the cost
    follows ``limit``, not the number of keywords in the batch (five a line in a chatty run)."""
    starts = list(accumulate(map((1).__add__, map(len, texts[:-1])), initial=0))
    stretches = 2 * limit
    size = len(lowered) / stretches
    lines: set[int] = set()
    for n in range(stretches):
        low, high = int(n * size), int((n + 1) * size)
        for keyword in KEYWORDS:  # any line of the stretch that may tell will do: the first keyword found
            at = lowered.find(keyword, low, high)
            if at != -1:
                lines.add(bisect_right(starts, at) - 1)
                break
    # The last lines: the run's latest word on its progress.
    tail = len(texts) - 10
    lines.update(tail + i for i, text in enumerate(texts[tail:]) if may_tell(text))
    lines |= marked_lines(lowered, starts, texts)
    return subset(sorted(lines), texts, limit)


def subset(candidates: list[int], texts: list[str], limit: int) -> list[int]:
    """An even subset of ``limit`` candidates, every checkpoint and evaluation line and the last five."""
    if len(candidates) <= limit:
        return candidates
    stride = len(candidates) / limit
    keep = {candidates[int(i * stride)] for i in range(limit)} | set(candidates[-5:])
    keep |= {i for i in candidates if "[Concurrent Checkpoint]" in texts[i]}
    for i in candidates:
        if EVAL_MARK in texts[i]:
            keep |= {i, *leading(texts, i)}
    return sorted(keep)


# Past this many candidate lines in one batch, only an even subset of them (and every
# checkpoint line, and the last few) is parsed: the curve keeps SAMPLES_PER_BATCH points of a
# batch anyway, and parsing every line of a run printing a loss per step would cost more than
# storing it.
MAX_PARSED_PER_BATCH = 64


def parse_lines(lines: Sequence[tuple[TS, str]]) -> list[tuple[TS, LineMetrics]]:
    """The lines of a batch that say something, with their times, in order."""
    if not lines:
        return []
    texts = [text for _, text in lines]
    found = []
    for index in candidate_lines(texts, MAX_PARSED_PER_BATCH):
        if INTERESTING.search(texts[index]) and (parsed := parse_candidate(texts[index])) is not None:
            found.append((lines[index][0], parsed))
    return found


def fold_lines(lines: Sequence[tuple[datetime, str]], *, start: Progress | None = None) -> BatchMetrics:
    return fold(parse_lines(lines), start=start)


def fold(parsed: Iterable[tuple[datetime, LineMetrics]], *, start: Progress | None = None) -> BatchMetrics:
    """Fold a batch's parsed lines, oldest first, onto the progress known before it.

    A sample takes the latest step known at its line (the Trainer logs the loss without a step;
    its tqdm bar tells the step); samples of one step merge, the later one's values winning.
    """
    batch = BatchMetrics(progress=start or Progress())
    samples: dict[int, MetricSample] = {}
    for ts, found in parsed:
        told = found.progress
        if found.checkpoint is not None:
            batch.checkpoints.append((found.checkpoint, ts))
            batch.changed = True
            # The step a checkpoint saved was reached; a commit that lands late never moves the step back.
            known = (told.step if told is not None else None) or batch.progress.step
            if known is None or found.checkpoint.step > known:
                told = (told or Progress()).merged(Progress(step=found.checkpoint.step))
            if told is None:
                continue
            before = batch.progress
            batch.progress = before.merged(told)
            continue
        assert told is not None
        before = batch.progress
        batch.progress = before.merged(told)
        if batch.progress != before or found.values:
            batch.changed = True
        if told.loss is not None or told.lr is not None or found.values:
            step = told.step if told.step is not None else before.step
            if step is not None:
                sample = MetricSample(step=step, epoch=batch.progress.epoch, loss=told.loss, lr=told.lr, ts=ts, values=dict(found.values))
                samples[step] = samples[step].merged(sample) if step in samples else sample
    batch.samples = sorted(samples.values(), key=lambda s: s.step)
    return batch
