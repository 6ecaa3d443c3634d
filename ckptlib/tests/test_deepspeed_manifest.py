"""DeepSpeed's layout has no ckptlib.json: each rank's files of a tag are recorded in
``<tag>/ckptlib-rank<r>.json`` at commit, checked by ``load`` and by the Trainer's resume.

DeepSpeed calls the adapter's ``save``, ``commit`` and ``load`` with a path and a commit info
(its ``tag``, ``save_dir``, ``save_latest``); these tests call them the same way, without
DeepSpeed, and write ``latest`` as DeepSpeed does after a commit that returned True."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from ckptlib import CheckpointError
from ckptlib._trainer import deepspeed_committed_steps
from ckptlib.deepspeed import DeepSpeedCheckpointEngine

MODEL_FILE = "mp_rank_00_model_states.pt"
OPTIM_FILE = "zero_pp_rank_0_mp_rank_00_optim_states.pt"


def _save_tag(adapter: DeepSpeedCheckpointEngine, checkpoint: Path, step: int) -> dict[str, torch.Tensor]:
    """One DeepSpeed-style save: two files into ``checkpoint/global_step<step>``, commit, ``latest``."""
    tag = f"global_step{step}"
    (checkpoint / tag).mkdir(parents=True)
    state = {"weight": torch.full((256, 256), float(step)), "bias": torch.arange(256.0) + step}
    adapter.save({"module": state}, str(checkpoint / tag / MODEL_FILE))
    adapter.save({"optimizer": {"exp_avg": state["weight"] * 2}}, str(checkpoint / tag / OPTIM_FILE))
    info = SimpleNamespace(tag=tag, save_dir=str(checkpoint), save_latest=True)
    assert adapter.commit(info) is True
    (checkpoint / "latest").write_text(tag)
    return state


@pytest.fixture
def adapter() -> Iterator[DeepSpeedCheckpointEngine]:
    engine = DeepSpeedCheckpointEngine(host_cache_size=0.05)
    yield engine
    engine.cleanup()


def test_commit_records_each_file_of_the_tag_and_load_checks_it(tmp_path: Path, adapter: DeepSpeedCheckpointEngine) -> None:
    state = _save_tag(adapter, tmp_path, 3)
    tag_dir = tmp_path / "global_step3"

    manifest = json.loads((tag_dir / "ckptlib-rank0.json").read_text())
    assert manifest["files"] == {name: (tag_dir / name).stat().st_size for name in (MODEL_FILE, OPTIM_FILE)}
    assert manifest["checksum"] == "sampled-crc32" and set(manifest["checksums"]) == {MODEL_FILE, OPTIM_FILE}
    loaded = adapter.load(str(tag_dir / MODEL_FILE))
    assert torch.equal(loaded["module"]["weight"], state["weight"])

    # The same size, one byte changed where the checksum samples (the first block).
    with open(tag_dir / MODEL_FILE, "r+b") as handle:
        first = handle.read(1)
        handle.seek(0)
        handle.write(bytes([first[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match=f"{tag_dir / MODEL_FILE}: its checksum"):
        adapter.load(str(tag_dir / MODEL_FILE))
    os.truncate(tag_dir / OPTIM_FILE, 100)
    with pytest.raises(CheckpointError, match=f"{tag_dir / OPTIM_FILE}: holds 100 bytes, the manifest records"):
        adapter.load(str(tag_dir / OPTIM_FILE))


def test_a_file_no_manifest_lists_loads_and_an_unreadable_one_is_a_checkpoint_error(tmp_path: Path, adapter: DeepSpeedCheckpointEngine) -> None:
    torch.save({"x": torch.ones(3)}, tmp_path / "written_by_deepspeed.pt")
    assert torch.equal(adapter.load(str(tmp_path / "written_by_deepspeed.pt"))["x"], torch.ones(3))
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"empty\.pt"):
        adapter.load(str(tmp_path / "empty.pt"))


@pytest.mark.parametrize("damage", ["truncated", "empty", "missing", "manifest"])
def test_resume_skips_a_damaged_deepspeed_checkpoint_naming_the_file(
    tmp_path: Path, adapter: DeepSpeedCheckpointEngine, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The Trainer's layout under DeepSpeed: ``<output_dir>/checkpoint-<step>/{latest, global_step<step>/}``."""
    for step in (3, 6):
        _save_tag(adapter, tmp_path / f"checkpoint-{step}", step)
    assert deepspeed_committed_steps(tmp_path) == [3, 6]

    tag_dir = tmp_path / "checkpoint-6" / "global_step6"
    named = {"truncated": MODEL_FILE, "empty": OPTIM_FILE, "missing": MODEL_FILE, "manifest": "ckptlib-rank0.json"}[damage]
    if damage == "truncated":
        os.truncate(tag_dir / MODEL_FILE, (tag_dir / MODEL_FILE).stat().st_size - 1)
    elif damage == "empty":
        (tag_dir / OPTIM_FILE).write_bytes(b"")
    elif damage == "missing":
        (tag_dir / MODEL_FILE).unlink()
    else:
        (tag_dir / "ckptlib-rank0.json").write_text("{not json")
    with caplog.at_level(logging.WARNING):
        assert deepspeed_committed_steps(tmp_path) == [3]
    assert f"damaged checkpoint skipped: {tag_dir / named}" in caplog.text
    assert deepspeed_committed_steps(tmp_path, verify=False) == [3, 6]


def test_a_latest_that_names_no_tag_in_the_directory_is_skipped(tmp_path: Path, adapter: DeepSpeedCheckpointEngine) -> None:
    _save_tag(adapter, tmp_path / "checkpoint-3", 3)
    (tmp_path / "checkpoint-3" / "latest").write_text("../elsewhere")
    assert deepspeed_committed_steps(tmp_path) == []
