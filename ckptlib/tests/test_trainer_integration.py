"""DecoratedCheckpointing on a Hugging Face Trainer (a tiny Llama built from a config)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

import ckptlib
from ckptlib.tests.helpers import RecordingHandler

if TYPE_CHECKING:
    from transformers import Trainer

pytest.importorskip("transformers")


def _trainer(assets: dict[str, str], output_dir: Path, *, max_steps: int, save_steps: int, **extra: Any) -> Trainer:
    # Lazy, after the importorskip above: transformers is optional.
    from transformers import AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, set_seed

    set_seed(42)
    tokenizer = AutoTokenizer.from_pretrained(assets["model"], local_files_only=True)
    tokenizer.pad_token = tokenizer.eos_token
    lines = Path(assets["train"]).read_text().splitlines()[:64]
    encoded = tokenizer(lines, truncation=True, max_length=16, padding="max_length")
    dataset = [{"input_ids": ids, "attention_mask": mask, "labels": ids} for ids, mask in zip(encoded["input_ids"], encoded["attention_mask"], strict=True)]
    model = AutoModelForCausalLM.from_pretrained(assets["model"], local_files_only=True)
    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=4,
        save_strategy="steps",
        save_steps=save_steps,
        logging_steps=1,
        report_to="none",
        use_cpu=True,
        seed=42,
        dataloader_num_workers=0,
        disable_tqdm=True,
        **extra,
    )
    return Trainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)


def _losses(trainer: Any) -> dict[int, float]:
    return {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def _decorate(trainer: Any) -> ckptlib.DecoratedCheckpointing:
    config = {"host_cache_size": 50, "parser_threads": 1, "pin_host_cache": True, "trainer": trainer}
    return ckptlib.DecoratedCheckpointing(runtime_config=config, rank=-1)


def _uninterrupted_losses(assets: dict[str, str], output_dir: Path) -> dict[int, float]:
    """8 steps with a checkpoint every 4, persisted: the losses a resumed run must log again."""
    trainer = _trainer(assets, output_dir, max_steps=8, save_steps=4)
    engine = _decorate(trainer)
    trainer.train()
    engine.wait(persist=True)
    engine.shutdown()
    return _losses(trainer)


@pytest.mark.slow
def test_a_resumed_run_continues_the_same_loss_curve(offline_assets: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    expected = _uninterrupted_losses(offline_assets, tmp_path)
    assert sorted(expected) == list(range(1, 9))
    assert ckptlib.committed_steps(tmp_path / "concurrent_checkpoint") == [4, 8]

    monkeypatch.setenv("CKPT_LAST_STEP", "4")
    resumed = _trainer(offline_assets, tmp_path, max_steps=8, save_steps=4)
    engine = _decorate(resumed)
    resumed.train(resume_from_checkpoint=True)
    engine.shutdown()
    # Steps 1-4 come back from trainer_state.json; 5-8 are trained again and must match exactly.
    assert _losses(resumed) == expected

    # The stock Trainer, undecorated, loads the same directory.
    stock = _trainer(offline_assets, tmp_path / "stock", max_steps=8, save_steps=100)
    stock.train(resume_from_checkpoint=str(tmp_path / "concurrent_checkpoint" / "checkpoint-4"))
    assert _losses(stock) == expected


@pytest.mark.slow  # a training process of its own
def test_with_no_checkpoint_it_logs_and_starts_from_scratch(
    offline_assets: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: RecordingHandler
) -> None:
    monkeypatch.setenv("CKPT_LAST_STEP", "-1")
    trainer = _trainer(offline_assets, tmp_path, max_steps=2, save_steps=100)
    engine = _decorate(trainer)
    trainer.train(resume_from_checkpoint=True)
    engine.shutdown()
    assert "[Concurrent Checkpoint] No Checkpoint found with step: -1" in records.messages
    assert trainer.state.global_step == 2


@pytest.mark.slow  # a training process of its own
def test_ckpt_last_step_picks_that_checkpoint_else_the_latest(
    offline_assets: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: RecordingHandler
) -> None:
    trainer = _trainer(offline_assets, tmp_path, max_steps=6, save_steps=2, save_total_limit=2)
    engine = _decorate(trainer)
    trainer.train()
    engine.wait(persist=True)
    root = tmp_path / "concurrent_checkpoint"
    # save_total_limit rotates committed checkpoints only.
    assert ckptlib.committed_steps(root) == [4, 6]
    assert not list(tmp_path.glob("checkpoint-*")), "the Trainer's own saves went through the engine"

    monkeypatch.setenv("CKPT_LAST_STEP", "4")
    assert engine.resolve_resume(True) == str(root / "checkpoint-4")
    monkeypatch.setenv("CKPT_LAST_STEP", "-1")
    assert engine.resolve_resume(True) == str(root / "checkpoint-6")
    monkeypatch.setenv("CKPT_LAST_STEP", "3")
    assert engine.resolve_resume(True) == str(root / "checkpoint-6")
    assert "[Concurrent Checkpoint] No Checkpoint found with step: 3" in records.messages
    monkeypatch.delenv("CKPT_LAST_STEP")
    assert engine.resolve_resume(True) == str(root / "checkpoint-6")
    assert engine.resolve_resume(False) is False
    engine.shutdown()

    commits = [e for m in records.messages if (e := ckptlib.parse_commit_line(m))]
    assert [e.step for e in commits] == [2, 4, 6]
    assert all(e.bytes > 0 and e.persist_s >= e.blocking_s >= 0 for e in commits)


@pytest.mark.slow  # a training process of its own
def test_the_optimizer_waits_for_staging_not_for_disk(offline_assets: dict[str, str], tmp_path: Path) -> None:
    trainer = _trainer(offline_assets, tmp_path, max_steps=4, save_steps=2)
    engine = _decorate(trainer)
    trainer.train()
    engine.shutdown()
    loaded = engine.load(2)
    saved = loaded.state["model"]
    assert trainer.model is not None
    assert set(saved) >= {name for name, _ in trainer.model.named_parameters()}
    final = engine.load(4).state["model"]
    assert not all(torch.equal(saved[k], final[k]) for k in saved)


@pytest.mark.slow  # two training processes
def test_a_damaged_newest_checkpoint_is_skipped_when_the_trainer_resumes(
    offline_assets: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: RecordingHandler
) -> None:
    """Verify before resume, on the Trainer's path: the newest checkpoint's weights truncated, the
    Trainer told to resume picks the one before it and trains on as the uninterrupted run did."""
    expected = _uninterrupted_losses(offline_assets, tmp_path)
    root = tmp_path / "concurrent_checkpoint"
    weights = root / "checkpoint-8" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])

    monkeypatch.delenv("CKPT_LAST_STEP", raising=False)
    resumed = _trainer(offline_assets, tmp_path, max_steps=8, save_steps=4)
    engine = _decorate(resumed)
    assert engine.resolve_resume(True) == str(root / "checkpoint-4")
    resumed.train(resume_from_checkpoint=True)
    engine.shutdown()
    assert any("damaged checkpoint skipped" in message and "checkpoint-8/model.safetensors" in message for message in records.messages)
    assert _losses(resumed) == expected
