"""SIGTERM at random moments (inside ``optimizer.step()`` included): every committed checkpoint,
the final one included, equals bit for bit a deep copy of the state taken at its step."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ckptlib
from ckptlib.tests.conftest import REPO_ROOT
from ckptlib.tests.helpers import assert_same

CHILD = str(Path(__file__).with_name("_sigterm_child.py"))


def _start(directory: Path, mode: str, env: dict[str, str], self_signal_at: int) -> subprocess.Popen[str]:
    directory.mkdir()
    command = [sys.executable, CHILD, str(directory / "out"), str(directory / "refs.pt"), str(directory / "landed")]
    return subprocess.Popen(
        [*command, mode, "2", str(self_signal_at)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _check(directory: Path, process: subprocess.Popen[str]) -> tuple[str, int, int]:
    """Returns where the signal landed, the final step and the number of checkpoints compared."""
    _, stderr = process.communicate(timeout=90)
    assert process.returncode == 143, stderr[-3000:]
    recorded = torch.load(directory / "refs.pt", weights_only=False)
    refs, last_step = recorded["refs"], recorded["last_step"]
    engine = ckptlib.CheckpointEngine(output_dir=directory / "out", handle_signals=False)
    try:
        steps = engine.committed_steps()
        assert steps and steps[-1] == last_step, (steps, last_step, stderr[-2000:])
        for step in steps:
            loaded = engine.load(step).state
            for key, expected in refs[step].items():
                assert_same(expected, loaded[key], f"step {step} {key}")
    finally:
        engine.shutdown()
    return (directory / "landed").read_text(), last_step, len(steps)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["hooks", "safe_point"])
def test_a_sigterm_anywhere_yields_a_final_checkpoint_of_exactly_its_step(mode: str, job_env: dict[str, str], tmp_path: Path) -> None:
    env = {**job_env, "PYTHONPATH": str(REPO_ROOT)}
    rng = random.Random(15)
    landed, compared = [], 0
    for pair in range(4 if mode == "hooks" else 2):
        # Two children at a time: each is mostly importing torch, then a short loop.
        trials = [(tmp_path / f"trial-{pair}-{index}") for index in range(2)]
        # One child signals itself inside optimizer.step() of a random step; the parent
        # signals the other at a random moment.
        processes = [_start(trials[0], mode, env, rng.randint(4, 9)), _start(trials[1], mode, env, 0)]
        for process in processes:
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.15))
        processes[1].send_signal(signal.SIGTERM)
        for directory, process in zip(trials, processes, strict=True):
            where, _, count = _check(directory, process)
            landed.append(where)
            compared += count
    assert "optimizer.step" in landed, landed
    assert compared >= 4
