"""Training progress read from log lines: a pure parser, no database.

What a line can tell:

* the Hugging Face Trainer's log dict: ``{'loss': 2.1, 'grad_norm': 1.3, 'learning_rate': 5e-05, 'epoch': 0.5}``;
* a tqdm bar (the Trainer's among them): `` 12%|█▏        | 12/100 [00:03<00:20,  4.31it/s]``;
* our example scripts: ``epoch 1/3 step 50/150 loss 0.036 lr 0.01``, ``step 12/400 loss 0.123``,
  ``step 12 loss 0.1234``; ``key=value`` spellings (``step=12 loss=0.5``) too;
* ckptlib's commit line (``[Concurrent Checkpoint] committed step=… bytes=…``): a checkpoint.

``parse_line`` reads one line; ``fold_lines`` folds a batch into the latest progress, the loss
curve's points and the checkpoints, in one pass.
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

from ckptlib import CommitEvent, parse_commit_line

NUMBER = r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?"
# A cheap test that skips most lines before any of the patterns below runs.
INTERESTING = re.compile(r"step|loss|epoch|learning_rate|\blr\b|\d/\d+ ?\[|Concurrent Checkpoint", re.IGNORECASE)
# The same test as plain lower-case substrings, run over a whole batch at once (a superset).
KEYWORDS = ("step", "loss", "epoch", "learning_rate", "lr ", "lr=", "lr:", "it/s", "s/it", "%|", "[concurrent checkpoint]")
TRAINER_DICT = re.compile(r"\{'[a-z_]+': [^{}]*\}")
TQDM = re.compile(r"(?<![\d/.])(\d+)/(\d+) ?\[(?:\d+:)?\d+:\d+")
STEP = re.compile(r"\b(?:global_)?step[ =:]+(\d+)(?:\s*/\s*(\d+))?\b", re.IGNORECASE)
EPOCH = re.compile(rf"\bepoch[ =:]+({NUMBER})(?:\s*/\s*(\d+))?", re.IGNORECASE)
LOSS = re.compile(rf"\b(?:train_)?loss[ =:]+({NUMBER}|nan|inf)\b", re.IGNORECASE)
LR = re.compile(rf"\b(?:lr|learning_rate)[ =:]+({NUMBER})", re.IGNORECASE)
MAX_DICT_CHARS = 2000


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
        return self == Progress()


@dataclass(frozen=True)
class LineMetrics:
    progress: Progress | None = None
    checkpoint: CommitEvent | None = None


@dataclass(frozen=True)
class MetricSample:
    """A point of the loss curve: at ``step`` (the latest step known when the loss was logged)."""

    step: int
    epoch: float | None
    loss: float | None
    lr: float | None
    ts: datetime


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
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def parse_trainer_dict(text: str) -> Progress | None:
    match = None
    for match in TRAINER_DICT.finditer(text):
        pass
    if match is None or len(match.group(0)) > MAX_DICT_CHARS:
        return None
    try:
        logged = ast.literal_eval(match.group(0))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(logged, dict):
        return None
    step = logged.get("step")
    progress = Progress(
        step=int(step) if isinstance(step, int) and step >= 0 else None,
        epoch=finite(logged.get("epoch")),
        loss=finite(logged.get("loss")),
        lr=finite(logged.get("learning_rate")),
    )
    return None if progress.empty else progress


def parse_words(text: str) -> Progress | None:
    """``epoch 1/3 step 50/150 loss 0.036 lr 0.01`` and its ``key=value`` spellings."""
    step = STEP.search(text)
    loss = LOSS.search(text)
    lr = LR.search(text)
    epoch = EPOCH.search(text)
    if not (step or loss or lr or epoch):
        return None
    progress = Progress(
        step=int(step.group(1)) if step else None,
        total=int(step.group(2)) if step and step.group(2) else None,
        epoch=finite(epoch.group(1)) if epoch else None,
        loss=finite(loss.group(1)) if loss else None,
        lr=finite(lr.group(1)) if lr else None,
    )
    return None if progress.empty else progress


def parse_tqdm(text: str) -> Progress | None:
    # A bar redrawn with carriage returns arrives as one line: its last drawing counts.
    matches = TQDM.findall(text)
    if not matches:
        return None
    done, total = (int(n) for n in matches[-1])
    if total <= 0 or done > total:
        return None
    return Progress(step=done, total=total)


def parse_line(text: str) -> LineMetrics | None:
    """What one log line says about progress or checkpoints; None when it says nothing."""
    if not INTERESTING.search(text):
        return None
    return parse_candidate(text)


def parse_candidate(text: str) -> LineMetrics | None:
    if "[Concurrent Checkpoint]" in text:
        event = parse_commit_line(text)
        return LineMetrics(checkpoint=event) if event is not None else None
    progress = parse_trainer_dict(text) if "{'" in text else None
    if progress is None:
        progress = parse_tqdm(text)
        words = parse_words(text) if progress is None else None
        progress = words or progress
    return LineMetrics(progress=progress) if progress is not None else None


def candidate_lines(texts: list[str]) -> list[int]:
    """Indexes of the lines that may tell progress: plain substring searches over the batch
    joined and lower-cased (C speed), not a Python call per line."""
    blob = "\n".join(texts)
    lowered = blob.lower()
    if len(lowered) != len(blob):  # a character whose lower case is longer: go line by line
        return [i for i, text in enumerate(texts) if INTERESTING.search(text)]
    positions = []
    for keyword in KEYWORDS:
        at = lowered.find(keyword)
        while at != -1:
            positions.append(at)
            at = lowered.find(keyword, at + 1)
    if not positions:
        return []
    starts = list(accumulate((len(t) + 1 for t in texts[:-1]), initial=0))
    return sorted({bisect_right(starts, at) - 1 for at in positions})


# Past this many candidate lines in one batch, only an even subset of them (and every
# checkpoint line, and the last few) is parsed: the curve keeps SAMPLES_PER_BATCH points of a
# batch anyway, and parsing every line of a run printing a loss per step would cost more than
# storing it.
MAX_PARSED_PER_BATCH = 200


def parse_lines(lines: Sequence[tuple[datetime, str]]) -> list[tuple[datetime, LineMetrics]]:
    """The lines of a batch that say something, with their times, in order."""
    if not lines:
        return []
    texts = [text for _, text in lines]
    found = []
    candidates = candidate_lines(texts)
    if len(candidates) > MAX_PARSED_PER_BATCH:
        stride = len(candidates) / MAX_PARSED_PER_BATCH
        keep = {candidates[int(i * stride)] for i in range(MAX_PARSED_PER_BATCH)} | set(candidates[-5:])
        keep |= {i for i in candidates if "[Concurrent Checkpoint]" in texts[i]}
        candidates = sorted(keep)
    for index in candidates:
        if INTERESTING.search(texts[index]) and (parsed := parse_candidate(texts[index])) is not None:
            found.append((lines[index][0], parsed))
    return found


def fold_lines(lines: Sequence[tuple[datetime, str]], *, start: Progress | None = None) -> BatchMetrics:
    return fold(parse_lines(lines), start=start)


def fold(parsed: Iterable[tuple[datetime, LineMetrics]], *, start: Progress | None = None) -> BatchMetrics:
    """Fold a batch's parsed lines, oldest first, onto the progress known before it.

    A loss sample takes the latest step known at its line (the Trainer logs the loss without a
    step; its tqdm bar tells the step); samples of one step keep the last one.
    """
    batch = BatchMetrics(progress=start or Progress())
    samples: dict[int, MetricSample] = {}
    for ts, found in parsed:
        if found.checkpoint is not None:
            batch.checkpoints.append((found.checkpoint, ts))
            batch.changed = True
            continue
        told = found.progress
        assert told is not None
        before = batch.progress
        batch.progress = before.merged(told)
        if batch.progress != before:
            batch.changed = True
        if told.loss is not None or told.lr is not None:
            step = told.step if told.step is not None else before.step
            if step is not None:
                samples[step] = MetricSample(step=step, epoch=batch.progress.epoch, loss=told.loss, lr=told.lr, ts=ts)
    batch.samples = sorted(samples.values(), key=lambda s: s.step)
    return batch
