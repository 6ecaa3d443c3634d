"""SIGKILL at any instant of a persist leaves the last committed checkpoint whole and selected."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import ckptlib
from ckptlib import _format

TRIALS = 20


def _run_and_kill(output_dir: Path, delay_s: float) -> list[int]:
    """Starts the saving child, kills it ``delay_s`` after its first commit; returns logged commits."""
    child = subprocess.Popen(
        [sys.executable, "-m", "ckptlib.tests._kill_child", str(output_dir)],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "THP_MEM_ALLOC_ENABLE": "1"},
    )
    assert child.stderr is not None
    lines = []
    for line in child.stderr:
        lines.append(line)
        if ckptlib.parse_commit_line(line):
            break
    time.sleep(delay_s)
    child.send_signal(signal.SIGKILL)
    _, rest = child.communicate()
    lines += rest.splitlines()
    assert child.returncode == -signal.SIGKILL, "".join(lines[-20:])
    return [event.step for line in lines if (event := ckptlib.parse_commit_line(line))]


@pytest.mark.slow
def test_it_always_resumes_from_the_last_committed_step(tmp_path: Path) -> None:
    rng = random.Random(20240601)
    for trial in range(TRIALS):
        output_dir = tmp_path / f"trial-{trial}"
        logged = _run_and_kill(output_dir, delay_s=rng.uniform(0.0, 0.4))

        engine = ckptlib.CheckpointEngine(output_dir=output_dir, host_cache_size=0.1, handle_signals=False)
        try:
            latest = engine.latest_step()
            # Logged after the rename: the newest commit is at least the last logged one.
            assert latest is not None and latest >= logged[-1], (trial, latest, logged)
            loaded = engine.load()
            assert loaded.step == latest
            assert loaded.state["counter"] == {"step": latest}
            for name, tensor in loaded.state["model"].items():
                assert torch.all(tensor == latest), (trial, name)
            # A fresh engine cleans up what the killed run left half-written.
            assert not list(_format.checkpoint_root(output_dir).glob("*.tmp"))
        finally:
            engine.shutdown()
        shutil.rmtree(output_dir)  # 20 trials of ~65 MB each: a checked trial's files are not needed
