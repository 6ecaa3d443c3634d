"""The platform's fence (docs/failover.md, "A lost node's run"): once a later attempt of the job
owns its output, a run of an earlier one, still going on a node taken as lost, commits and
rotates nothing; the checkpoint the new attempt resumed from stays the latest."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import ckptlib
from ckptlib import _format
from ckptlib.tests.helpers import small_training_state, train_steps


@pytest.fixture
def fence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "fence" / "attempt"
    path.parent.mkdir()
    path.write_text("1\n")
    monkeypatch.setenv("JOB_FENCE", str(path))
    monkeypatch.setenv("JOB_ATTEMPT", "1")
    return path


@pytest.fixture
def engine_beside_the_fence(tmp_path: Path) -> Iterator[ckptlib.CheckpointEngine]:
    """An engine whose output directory lies beside the fence's (``tmp_path / "output"``, not
    ``tmp_path`` itself, where the fence and other files of the test lie)."""
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path / "output", host_cache_size=0.05, handle_signals=False)
    yield engine
    engine.shutdown()


def test_a_run_whose_attempt_is_superseded_commits_nothing(engine_beside_the_fence: ckptlib.CheckpointEngine, fence: Path) -> None:
    state = small_training_state()
    train_steps(state, 1)
    engine_beside_the_fence.save(state, step=10)
    [first] = engine_beside_the_fence.wait(persist=True)
    assert first.committed  # the fence names this attempt: it commits

    fence.write_text("2\n")  # the job was re-placed: attempt 2 owns the output now
    train_steps(state, 1)
    engine_beside_the_fence.save(state, step=20)
    [second] = engine_beside_the_fence.wait(persist=True)
    assert not second.committed
    assert "attempt 2 of this job has started elsewhere" in str(second.error) and "step 20 is discarded" in str(second.error)
    assert engine_beside_the_fence.committed_steps() == [10] and ckptlib.read_latest(engine_beside_the_fence.root) == 10
    assert not _format.tmp_dir(engine_beside_the_fence.root, 20).exists()


def test_a_superseded_run_rotates_nothing_out(tmp_path: Path, fence: Path) -> None:
    root = _format.checkpoint_root(tmp_path)
    for step in (10, 20, 30):
        directory = _format.committed_dir(root, step)
        directory.mkdir(parents=True)
        _format.write_manifest(directory, {"step": step, "keys": {}, "world_size": 1})
    fence.write_text("3\n")
    assert _format.rotate(root, keep=1) == []
    assert _format.committed_steps(root) == [10, 20, 30]
    fence.write_text("1\n")
    assert _format.rotate(root, keep=1) == [10, 20]


@pytest.mark.parametrize("content", ["", "not a number", "9" * 200])
def test_an_unreadable_fence_refuses_nothing(engine_beside_the_fence: ckptlib.CheckpointEngine, fence: Path, content: str) -> None:
    fence.write_text(content)
    engine_beside_the_fence.save(small_training_state(), step=5)
    [result] = engine_beside_the_fence.wait(persist=True)
    assert result.committed


def test_without_the_platform_nothing_is_fenced(engine_beside_the_fence: ckptlib.CheckpointEngine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("JOB_FENCE", str(tmp_path / "missing"))
    monkeypatch.setenv("JOB_ATTEMPT", "1")
    engine_beside_the_fence.save(small_training_state(), step=5)
    assert engine_beside_the_fence.wait(persist=True)[0].committed
    monkeypatch.delenv("JOB_FENCE")
    engine_beside_the_fence.save(small_training_state(), step=6)
    assert engine_beside_the_fence.wait(persist=True)[0].committed


def test_a_superseded_run_installs_no_file_of_its_own_layout(tmp_path: Path, fence: Path) -> None:
    """DeepSpeed's layout (``save_file``, each file renamed onto its own path): a stray's late
    save never replaces a file of the checkpoint the new attempt wrote under the same tag."""
    import torch

    from ckptlib._dropin import PathCheckpointing

    engine = PathCheckpointing({"host_cache_size": 0.05}, rank=0)
    try:
        path = tmp_path / "checkpoint-8" / "global_step8" / "mp_rank_00_model_states.pt"
        path.parent.mkdir(parents=True)
        engine.save({"module": torch.ones(4)}, path)
        engine.wait(persist=True)
        assert torch.equal(torch.load(path, weights_only=False)["module"], torch.ones(4))
        fence.write_text("2 the-platforms-name-for-the-job\n")  # attempt 2 wrote the same tag since
        engine.save({"module": torch.zeros(4)}, path)
        with pytest.raises(Exception, match="attempt 2 of this job has started elsewhere"):
            engine.wait(persist=True)
        assert torch.equal(torch.load(path, weights_only=False)["module"], torch.ones(4))
        assert [p.name for p in path.parent.iterdir()] == [path.name]
    finally:
        engine.shutdown()
