"""Progress of a Trainer run is the Trainer's own step: the lines a 200-step run of the guide's
Spot script stores (one per newline, the last redraw of a bar kept, as the agent keeps it), read one
by one as they arrive, never show a data-preparation or evaluation bar's figures, and every loss
the Trainer logged is a point at its step."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from logs.progress_parser import Progress, fold_lines, parse_line

T0 = datetime(2026, 12, 2, 13, 0, tzinfo=UTC)
PREFIX = "[2026-12-02 13:07:50,747] [INFO] [_trainer.py:198:on_log] [Concurrent Checkpoint]"
EVALUATION = [
    "  0%|          | 0/5 [00:00<?, ?it/s]\x1b[A",
    " 60%|██████    | 3/5 [00:00<00:00, 25.42it/s]\x1b[A",
    "100%|██████████| 5/5 [00:00<00:00, 12.44it/s]\x1b[A",
    "\x1b[A{'eval_loss': '4.919', 'eval_runtime': '0.4697', 'eval_samples_per_second': '85.16', 'epoch': '2'}",
]


def stored_lines(*, step_lines: bool = True) -> list[str]:
    lines = [
        "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 121.37it/s]",
        "Starting dataset initialization",
        "Map: 100%|██████████| 400/400 [00:00<00:00, 4385.90 examples/s]",
        "Map: 100%|██████████| 40/40 [00:00<00:00, 1695.22 examples/s]",
        "Loading weights: 100%|██████████| 20/20 [00:00<00:00, 14055.98it/s]",
        "  0%|          | 0/200 [00:00<?, ?it/s]/usr/lib/python3/torch/utils/data/dataloader.py:759: UserWarning: 'pin_memory'",
    ]
    for step in range(2, 201, 2):
        bar = f"{step // 2:3d}%|█         | {step}/200 [00:20<32:02,  9.71s/it]"
        if step_lines:
            lines.append(f"{bar}{PREFIX} trainer step={step}/200 epoch={step / 50:.4f}")
        lines.append(f"{{'loss': '{5 - step / 100:.3f}', 'grad_norm': '1.566', 'learning_rate': '4.975e-05', 'epoch': '{step / 50:g}'}}")
        if step % 20 == 0:
            lines.append(
                f"{bar}{PREFIX} committed step={step} bytes=608429 blocking_s=0.022720 persist_s=0.143861 "
                f"path=/job/work/results/concurrent_checkpoint/checkpoint-{step}"
            )
        if step % 100 == 0:
            lines += [*EVALUATION[:-1], EVALUATION[-1].replace("'epoch': '2'", f"'epoch': '{step // 50}'"), bar]
    return lines


def progress_as_lines_arrive(lines: list[str]) -> tuple[list[Progress], list[tuple[int, float | None]]]:
    progress, shown, points = Progress(), [], {}
    for i, text in enumerate(lines):
        batch = fold_lines([(T0 + timedelta(seconds=i), text)], start=progress)
        progress = batch.progress
        shown.append(progress)
        # As the store merges a step's points: a later line without a loss (the run's summary
        # dict, an evaluation's) keeps the loss the step had.
        points.update({s.step: s.loss if s.loss is not None else points.get(s.step) for s in batch.samples})
    return shown, sorted(points.items())


def test_progress_goes_to_the_trainers_max_steps_and_never_shows_another_bar():
    shown, _points = progress_as_lines_arrive(stored_lines())
    told = [p for p in shown if p.step is not None]
    assert {p.total for p in told} == {200}
    steps = [p.step for p in told]
    assert steps == sorted(steps) and steps[0] == 0 and steps[-1] == 200
    assert shown[-1].epoch == 4.0


def test_every_logged_loss_is_a_point_at_the_trainers_step():
    _, points = progress_as_lines_arrive(stored_lines())
    assert [step for step, _ in points] == list(range(2, 201, 2))
    assert points[0] == (2, 4.98) and points[-1] == (200, 3.0)


def test_without_ckptlibs_step_lines_the_evaluation_bar_still_never_counts():
    shown, _ = progress_as_lines_arrive(stored_lines(step_lines=False))
    assert {p.total for p in shown if p.total is not None} == {200}
    steps = [p.step for p in shown if p.step is not None]
    assert steps == sorted(steps) and steps[-1] == 200  # commit lines and the bars before them


def test_data_preparation_and_nested_bars_tell_nothing():
    for line in [
        "Writing model shards: 100%|██████████| 1/1 [00:00<00:00, 121.37it/s]",
        "Map: 100%|██████████| 400/400 [00:00<00:00, 4385.90 examples/s]",
        "Generating train split: 100%|██████████| 400/400 [00:00<00:00, 3150.33 examples/s]",
        EVALUATION[1],
    ]:
        assert parse_line(line) is None, line
    found = parse_line("Training: 12%|█▏        | 12/100 [00:03<00:20,  4.31it/s]")
    assert found is not None and found.progress == Progress(step=12, total=100)


def test_a_late_commit_never_moves_the_step_back():
    batch = fold_lines([(T0, f"{PREFIX} committed step=20 bytes=1 blocking_s=0.1 persist_s=0.2 path=/job/work/c")], start=Progress(step=24, total=200))
    assert batch.progress.step == 24 and len(batch.checkpoints) == 1
