"""In-memory per-step snapshots (``CKPT_SNAPSHOT_DIR``) and resuming from their replicas
(``CKPT_RESUME_ROOT``): checkpointless failover, ckptlib's side."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

import ckptlib
from ckptlib._snapshot import snapshot_settings
from ckptlib.tests.conftest import REPO_ROOT
from ckptlib.tests.helpers import RecordingHandler, assert_same, small_training_state, snapshot, train_steps

_STEP_LINE = re.compile(r"^step (\d+)/\d+ loss (\S+)$", re.MULTILINE)


@pytest.fixture
def memory_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs (/dev/shm, no O_DIRECT: as the platform's mount), else under tmp_path."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        directory = Path(tempfile.mkdtemp(prefix="ckptlib-test-", dir=shm))
        yield directory
        shutil.rmtree(directory, ignore_errors=True)
    else:
        yield tmp_path / "memory"


def _snapshot_when_free(snapshot: Callable[..., bool], state: Mapping[str, Any], step: int, **options: Any) -> None:
    """Snapshots ``step`` with ``snapshot`` (an engine's), trying again while the previous snapshot
    is still in flight (for up to 60 s)."""
    deadline = time.monotonic() + 60
    while not snapshot(state, step=step, **options):
        assert time.monotonic() < deadline, f"the snapshot of step {step} was never taken"
        time.sleep(0.001)


def test_snapshots_are_off_without_a_snapshot_dir(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CKPT_SNAPSHOT_DIR", raising=False)
    assert snapshot_settings(rank=0) is None
    monkeypatch.setenv("CKPT_SNAPSHOT_DIR", "")
    assert snapshot_settings(rank=0) is None


def test_each_rank_snapshots_into_its_own_dir_every_nth_step(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CKPT_SNAPSHOT_DIR", str(tmp_path))
    monkeypatch.setenv("CKPT_SNAPSHOT_EVERY", "5")
    settings = snapshot_settings(rank=3)
    assert settings is not None
    assert settings.root == tmp_path / "rank-3" / "concurrent_checkpoint"
    assert settings.every == 5
    monkeypatch.setenv("CKPT_SNAPSHOT_EVERY", "0")
    assert snapshot_settings(rank=0) == snapshot_settings(rank=0, every=1)


@pytest.mark.slow  # the engine's writer threads
def test_snapshots_each_step_keep_the_newest_two_per_rank_and_read_back(
    memory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: RecordingHandler
) -> None:
    monkeypatch.setenv("CKPT_SNAPSHOT_DIR", str(memory_dir))
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")  # no other rank runs: a snapshot waits for none
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=False)
    state = small_training_state()
    for step in range(1, 6):
        train_steps(state, 1)
        _snapshot_when_free(engine.snapshot, state, step)
    expected = snapshot(state)
    engine.shutdown()

    root = memory_dir / "rank-3" / "concurrent_checkpoint"
    assert ckptlib.committed_steps(root) == [4, 5]
    assert ckptlib.read_latest(root) == 5
    assert sorted(p.name for p in root.iterdir()) == ["checkpoint-4", "checkpoint-5", "latest"]
    reader = ckptlib.CheckpointEngine(output_dir=memory_dir / "rank-3", host_cache_size=0.1, handle_signals=False)
    loaded = reader.load()
    reader.shutdown()
    for key in ("model", "optimizer", "scheduler"):
        assert_same(expected[key], loaded.state[key], key)
    assert "rng_state" in loaded.state
    # A snapshot is not a checkpoint: no commit line, nothing on disk.
    assert not [m for m in records.messages if ckptlib.parse_commit_line(m)]
    assert engine.committed_steps() == []


@pytest.mark.slow  # the engine's writer threads
def test_a_snapshot_still_in_flight_makes_the_next_one_skip_without_waiting(memory_dir: Path, tmp_path: Path) -> None:
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=False, snapshot_dir=memory_dir)
    state = small_training_state()
    gate = threading.Event()
    assert engine.snapshot(state, step=1, write_files_later=lambda _directory: gate.wait())
    train_steps(state, 1)
    # The first is held before its commit: the next is skipped at once, never queued behind it.
    assert engine.snapshot(state, step=2) is False
    gate.set()
    train_steps(state, 1)
    _snapshot_when_free(engine.snapshot, state, 3)
    engine.shutdown()
    assert ckptlib.committed_steps(memory_dir / "rank-0" / "concurrent_checkpoint") == [1, 3]


@pytest.mark.slow  # the engine's writer threads
def test_only_steps_divisible_by_snapshot_every_are_snapshotted(memory_dir: Path, tmp_path: Path) -> None:
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=False, snapshot_dir=memory_dir, snapshot_every=3)
    state = small_training_state()
    taken = [step for step in range(1, 5) if engine.snapshot(state, step=step)]
    engine.shutdown()
    assert taken == [3]
    off = ckptlib.CheckpointEngine(output_dir=tmp_path / "off", host_cache_size=0.1, handle_signals=False, snapshot_dir="")
    assert off.snapshot(state, step=1) is False
    off.shutdown()


def _save_disk_and_memory(memory_dir: Path, output_dir: Path) -> dict[str, Any]:
    """A disk checkpoint of step 2 and a snapshot of step 3; returns the state at step 3."""
    engine = ckptlib.CheckpointEngine(output_dir=output_dir, host_cache_size=0.1, handle_signals=False, snapshot_dir=memory_dir)
    state = small_training_state()
    train_steps(state, 2)
    engine.save(state, step=2)
    engine.wait(persist=True)
    train_steps(state, 1)
    _snapshot_when_free(engine.snapshot, state, 3)
    engine.shutdown()
    return snapshot(state)


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # the last sampled block always ends at the file's end
    path.write_bytes(bytes(data))


def _damage(replica: Path, how: str) -> str:
    """Damages the replica of step 3; returns what the refusal must name."""
    checkpoint = replica / "rank-0" / "concurrent_checkpoint" / "checkpoint-3"
    if how == "flipped byte":
        _flip_last_byte(checkpoint / "model.safetensors")
        return "model.safetensors: its checksum (sampled-crc32) differs"
    if how == "short file":
        path = checkpoint / "optimizer.pt"
        os.truncate(path, path.stat().st_size - 1)
        return "optimizer.pt: holds"
    if how == "no manifest":
        (checkpoint / "ckptlib.json").unlink()
        return "ckptlib.json: cannot be read"
    assert how == "linked rank dir"
    rank_dir = replica / "rank-0"
    rank_dir.rename(replica / "elsewhere")
    rank_dir.symlink_to(replica / "elsewhere")
    return "rank-0"


@pytest.mark.slow  # the engine's writer threads
def test_a_failover_loads_the_replica_of_a_step_not_on_disk(
    memory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: RecordingHandler
) -> None:
    expected = _save_disk_and_memory(memory_dir, tmp_path)
    replica = tmp_path / "replica"
    shutil.copytree(memory_dir, replica)  # the node agent's copy to another node
    monkeypatch.setenv("CKPT_RESUME_ROOT", str(replica))
    monkeypatch.setenv("CKPT_LAST_STEP", "3")
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=False, snapshot_dir="")
    fresh = small_training_state(seed=1)
    loaded = engine.load(3, into=fresh)
    assert loaded.step == 3
    assert "[Concurrent Checkpoint] resuming from the in-memory replica step=3" in records.messages
    for key in ("model", "optimizer", "scheduler"):
        assert_same(expected[key], fresh[key].state_dict(), key)
    # Later saves go to the engine's own root.
    engine.save(fresh, step=4)
    engine.wait(persist=True)
    engine.shutdown()
    assert engine.committed_steps() == [2, 4]


@pytest.mark.slow  # the engine's writer threads
@pytest.mark.parametrize("how", ["flipped byte", "short file", "no manifest", "linked rank dir"])
def test_a_damaged_replica_is_refused_with_its_reason_and_the_disk_checkpoint_is_used(
    how: str, memory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: RecordingHandler
) -> None:
    _save_disk_and_memory(memory_dir, tmp_path)
    replica = tmp_path / "replica"
    shutil.copytree(memory_dir, replica)
    reason = _damage(replica, how)
    monkeypatch.setenv("CKPT_RESUME_ROOT", str(replica))
    monkeypatch.setenv("CKPT_LAST_STEP", "3")
    engine = ckptlib.CheckpointEngine(output_dir=tmp_path, host_cache_size=0.1, handle_signals=False, snapshot_dir="")
    loaded = engine.load(3, into=small_training_state(seed=1))
    engine.shutdown()
    assert loaded.step == 2
    [refusal] = [m for m in records.messages if "not resuming from the in-memory replica step=3" in m]
    assert reason in refusal
    assert not [m for m in records.messages if "resuming from the in-memory replica" in m and m != refusal]


def _run_train_ckpt(output_dir: Path, *, steps: int, env: dict[str, str], sleep: float = 0) -> str:
    options = ["--steps", str(steps), "--save-every", "5", "--sleep", str(sleep), "--output-dir", str(output_dir)]
    command = [sys.executable, "-m", "jobs.examples.train_ckpt", *options]
    done = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def _losses(output: str) -> dict[int, str]:
    return {int(step): loss for step, loss in _STEP_LINE.findall(output)}


@pytest.mark.slow  # training processes
def test_train_ckpt_resumed_from_a_replica_prints_the_losses_of_an_uninterrupted_run(memory_dir: Path, tmp_path: Path, job_env: dict[str, str]) -> None:
    env = {k: v for k, v in job_env.items() if not k.startswith("CKPT_")}
    uninterrupted = _losses(_run_train_ckpt(tmp_path / "uninterrupted", steps=12, env=env))

    # A snapshot still in flight makes the next steps skip theirs: with no pause between steps, a
    # loaded machine (CI) once let steps 6-8 pass while step 5's was written, and only 5 was left.
    first = _run_train_ckpt(tmp_path / "out", steps=8, env={**env, "CKPT_SNAPSHOT_DIR": str(memory_dir)}, sleep=0.2)
    assert [e.step for line in first.splitlines() if (e := ckptlib.parse_commit_line(line))] == [5]
    root = memory_dir / "rank-0" / "concurrent_checkpoint"
    last = ckptlib.read_latest(root)
    assert last is not None and last > 5
    replica = tmp_path / "replica"
    shutil.copytree(memory_dir, replica)

    resumed = _run_train_ckpt(tmp_path / "out", steps=12, env={**env, "CKPT_LAST_STEP": str(last), "CKPT_RESUME_ROOT": str(replica)})
    assert f"[Concurrent Checkpoint] resuming from the in-memory replica step={last}" in resumed
    assert f"Resumed from checkpoint step {last}\n" in resumed
    losses = _losses(resumed)
    assert sorted(losses) == list(range(last + 1, 13))
    assert losses == {step: loss for step, loss in uninterrupted.items() if step > last}


@pytest.mark.slow  # a training process of its own
def test_a_decorated_trainer_snapshots_at_step_ends_and_resumes_from_the_replica(
    offline_assets: dict[str, str], memory_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, records: RecordingHandler
) -> None:
    pytest.importorskip("transformers")
    from ckptlib.tests.test_trainer_integration import _decorate, _losses, _trainer  # after the skip: transformers is optional

    monkeypatch.setenv("CKPT_SNAPSHOT_DIR", str(memory_dir))
    trainer = _trainer(offline_assets, tmp_path, max_steps=6, save_steps=100)
    decorated = _decorate(trainer)
    snapshotted: list[int] = []
    engine_snapshot = decorated.engine.snapshot

    def recording_snapshot(state: Any, *, step: int, **options: Any) -> bool:
        snapshotted.append(step)
        # A snapshot still in flight makes the next one skip (by design): on a loaded machine the
        # first (which opens the snapshot engine) can last past the five steps after it. Tried
        # again until taken, so that the last two steps' snapshots are the ones kept.
        _snapshot_when_free(engine_snapshot, state, step, **options)
        return True

    monkeypatch.setattr(decorated.engine, "snapshot", recording_snapshot)
    trainer.train()
    decorated.shutdown()
    expected = _losses(trainer)
    assert snapshotted == [1, 2, 3, 4, 5, 6]
    # The Trainer's own save at its last step is the only checkpoint: snapshots log no commit line.
    assert [e.step for m in records.messages if (e := ckptlib.parse_commit_line(m))] == [6]
    root = memory_dir / "rank-0" / "concurrent_checkpoint"
    steps = ckptlib.committed_steps(root)
    assert steps == [5, 6] and ckptlib.read_latest(root) == 6
    files = {p.name for p in (root / f"checkpoint-{steps[0]}").iterdir()}
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= files

    replica = tmp_path / "replica"
    shutil.copytree(memory_dir, replica)
    monkeypatch.delenv("CKPT_SNAPSHOT_DIR")
    monkeypatch.setenv("CKPT_RESUME_ROOT", str(replica))
    monkeypatch.setenv("CKPT_LAST_STEP", str(steps[0]))
    resumed = _trainer(offline_assets, tmp_path / "resumed", max_steps=6, save_steps=100)
    decorated = _decorate(resumed)
    resumed.train(resume_from_checkpoint=True)
    decorated.shutdown()
    assert f"[Concurrent Checkpoint] resuming from the in-memory replica step={steps[0]}" in records.messages
    assert resumed.state.global_step == 6
    after = {step: loss for step, loss in expected.items() if step > steps[0]}
    assert after and {step: loss for step, loss in _losses(resumed).items() if step > steps[0]} == after
