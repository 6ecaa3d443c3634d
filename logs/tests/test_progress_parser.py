"""The metrics parser reads progress from the log lines real training scripts print."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from ckptlib import CheckpointResult, CommitEvent
from logs.progress_parser import Progress, fold_lines, parse_line

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def progress_of(text: str) -> Progress | None:
    found = parse_line(text)
    return found.progress if found else None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("{'loss': 2.1, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': 0.5}", Progress(epoch=0.5, loss=2.1, lr=5e-05)),
        ("{'train_runtime': 12.5, 'train_samples_per_second': 80.1, 'train_loss': 0.61, 'epoch': 3.0}", Progress(epoch=3.0)),
        (" 12%|█▏        | 12/100 [00:03<00:20,  4.31it/s]", Progress(step=12, total=100)),
        ("  5%|▌ | 5/100 [00:01<00:19]\r 6%|▌ | 6/100 [00:01<00:18]\r 7%|▋ | 7/100 [00:01<00:18]", Progress(step=7, total=100)),
        ("epoch 1/3 step 50/150 loss 0.036 lr 0.01", Progress(step=50, total=150, epoch=1.0, loss=0.036, lr=0.01)),
        ("step 12/400 loss 0.123", Progress(step=12, total=400, loss=0.123)),
        ("step 12 loss 0.1234", Progress(step=12, loss=0.1234)),
        ("global_step=30 loss=1.5e-3 lr=3e-4", Progress(step=30, loss=0.0015, lr=0.0003)),
        ("Resumed from checkpoint step 40", Progress(step=40)),
    ],
)
def test_it_reads_progress_from_the_lines_training_scripts_print(line, expected):
    assert progress_of(line) == expected


@pytest.mark.parametrize(
    "line",
    [
        "Starting dataset initialization",
        "Training for 3 epochs, 150 steps, on 0",
        "loss nan at step",  # a word, no value
        "{'not': 'a trainer dict'}",
        "{'loss': __import__('os').system('true')}",  # never evaluated
        "downloading 3/5 files",
        "",
    ],
)
def test_it_ignores_lines_that_tell_no_progress(line):
    assert progress_of(line) is None


def test_a_nan_loss_is_not_a_value():
    assert progress_of("step 5 loss nan") == Progress(step=5)


def test_it_reads_ckptlib_commit_lines_as_checkpoints():
    line = CheckpointResult(step=40, path="/out/concurrent_checkpoint/step-40", bytes=1234, blocking_s=0.0123, persist_s=1.5, committed=True).log_line()
    found = parse_line("[2026-11-30 12:00:00,000] [INFO] [_engine.py:10:save] " + line)
    assert found is not None and found.progress is None
    assert found.checkpoint == CommitEvent(step=40, bytes=1234, blocking_s=0.0123, persist_s=1.5, path="/out/concurrent_checkpoint/step-40")


def test_a_batch_folds_into_the_latest_progress_and_one_sample_per_step():
    lines = [
        "Starting dataset initialization",
        " 10%|█ | 10/100 [00:01<00:09]",
        "{'loss': 2.0, 'learning_rate': 5e-05, 'epoch': 0.1}",
        " 20%|██ | 20/100 [00:02<00:08]",
        "{'loss': 1.5, 'learning_rate': 4e-05, 'epoch': 0.2}",
        "{'loss': 1.4, 'learning_rate': 4e-05, 'epoch': 0.2}",
    ]
    batch = fold_lines([(T0 + timedelta(seconds=i), text) for i, text in enumerate(lines)])
    assert batch.changed
    assert batch.progress == Progress(step=20, total=100, epoch=0.2, loss=1.4, lr=4e-05)
    assert [(s.step, s.loss) for s in batch.samples] == [(10, 2.0), (20, 1.4)]


def test_a_batch_continues_from_the_progress_known_before_it():
    batch = fold_lines([(T0, "loss 0.5")], start=Progress(step=7, total=10))
    assert batch.progress == Progress(step=7, total=10, loss=0.5)
    assert [(s.step, s.loss) for s in batch.samples] == [(7, 0.5)]


def test_a_batch_without_progress_changes_nothing():
    batch = fold_lines([(T0, "hello"), (T0, "world")], start=Progress(step=3))
    assert not batch.changed and batch.samples == [] and batch.checkpoints == []


def test_a_batch_finds_the_same_lines_as_one_by_one():
    from logs.progress_parser import parse_lines

    corpus = [
        "{'loss': 2.1, 'learning_rate': 5e-05, 'epoch': 0.5}",
        " 12%|█▏        | 12/100 [00:03<00:20,  4.31it/s]",
        "epoch 1/3 step 50/150 loss 0.036 lr 0.01",
        "plain",
        "İstanbul step 3 loss 1.0",
        "LR: 0.1",
        "Step=4",
        CheckpointResult(step=1, path="/p", bytes=1, blocking_s=0.1, persist_s=0.2, committed=True).log_line(),
    ]
    batch = parse_lines([(T0, text) for text in corpus])
    assert [found for _, found in batch] == [f for text in corpus if (f := parse_line(text)) is not None]


def test_a_flood_batch_is_sampled_evenly_and_keeps_every_checkpoint_and_its_last_word():
    """Past MAX_PARSED_PER_BATCH candidates, an even subset is parsed (the curve keeps
    SAMPLES_PER_BATCH points of a batch anyway): spread over the whole batch, with every commit
    line and the last line's progress, whatever the batch's size."""
    from logs.progress_parser import MAX_PARSED_PER_BATCH, parse_lines

    commit = CheckpointResult(step=1234, path="/p", bytes=1, blocking_s=0.1, persist_s=0.2, committed=True).log_line()
    texts = [f"[INFO] step {i}/5000 | loss {1 + i / 10000:.4f} | lr 3.00e-04" for i in range(5000)]
    texts[1234] = commit
    texts[2500] = "plain text that tells nothing"
    batch = parse_lines([(T0 + timedelta(milliseconds=i), text) for i, text in enumerate(texts)])
    steps = [found.progress.step for _, found in batch if found.progress is not None and found.checkpoint is None]
    assert MAX_PARSED_PER_BATCH <= len(batch) <= MAX_PARSED_PER_BATCH + 20
    assert any(found.checkpoint is not None and found.checkpoint.step == 1234 for _, found in batch)
    assert steps == sorted(steps) and steps[-1] == 4999
    gaps = [b - a for a, b in pairwise(steps)]
    assert max(gaps) <= 3 * 5000 / MAX_PARSED_PER_BATCH  # no stretch of the batch is left unread
    folded = fold_lines(list(zip([T0] * len(texts), texts, strict=True)))
    assert folded.progress.step == 4999 and folded.progress.total == 5000 and len(folded.checkpoints) == 1


@pytest.mark.parametrize("unix", [0.0, 1_764_849_600.0, 1_764_849_600.000001, 1_764_849_600.9999996, 1_764_849_600.5000005, 7_258_118_399.25])
def test_a_unix_time_is_stamped_as_its_datetime_is(unix):
    """The agent hands ingest the runner's unix times: stored and published as the same text as
    the datetime ``fromtimestamp`` makes of it."""
    from logs.services import utc_stamp

    assert utc_stamp(unix) == utc_stamp(datetime.fromtimestamp(unix, tz=UTC))
