"""The exactness suite: on every path (plain API, accelerate, the Hugging Face Trainer, a DeepSpeed
ZeRO-1 engine), every committed checkpoint equals, bit for bit, a deep copy of the state taken
at its step.

Each path trains with a checkpoint every step, random delays, an EMA and a tensor learning rate
changed in place after ``save()``, BatchNorm statistics, and Adam stepping parameters one by one
(``_exact_child.py``). Per path, three children:

* SIGTERM sent by the child itself a few milliseconds into ``optimizer.step()`` of a random step;
* SIGTERM sent by this test at a random moment;
  both must exit with status 143 with their last step committed;
* SIGKILL at a random moment (a checkpoint is always persisting: one is saved every step); the
  newest committed checkpoint must match. On the Trainer this child runs with
  ``save_total_limit=1``, and a new process then resumes from what the kill left.

Each path compares at least 50 checkpoints (at least 200 in all); the counts are printed.
"""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

import ckptlib
from ckptlib.tests.conftest import REPO_ROOT
from ckptlib.tests.helpers import assert_same

pytestmark = pytest.mark.slow

PATHS = ["plain", "accelerate", "trainer", "deepspeed"]
MIN_PER_PATH = 50
_PORTS = iter(range(29581, 29700))


def _start(path: str, directory: Path, env: dict[str, str], *, ready_at: int, self_signal_at: int, max_steps: int, limit: int = 0) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", "ckptlib.tests._exact_child", path, str(directory / "out"), str(directory / "refs")]
    command += [str(ready_at), str(self_signal_at), str(max_steps)] + ([str(limit)] if limit else [])
    env = {**env, "DS_TEST_PORT": str(next(_PORTS))}
    return subprocess.Popen(
        command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )  # fmt: skip


def _wait_ready(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        if line.strip() == "ready":
            return
    raise AssertionError(f"the child ended before it was ready: {process.wait()} {process.stderr.read()[-3000:]}")  # type: ignore[union-attr]


def _committed(path: str, out: Path) -> list[int]:
    if path != "deepspeed":
        return ckptlib.committed_steps(out / ckptlib.CHECKPOINT_SUBDIR)
    # DeepSpeed's `latest` names the newest committed tag; every older tag was committed before it.
    latest_file = out / "latest"
    if not latest_file.is_file():
        return []
    latest = int(re.search(r"(\d+)$", latest_file.read_text().strip()).group(1))  # type: ignore[union-attr]
    tags = [int(p.name.removeprefix("global_step")) for p in out.glob("global_step*")]
    return sorted(step for step in tags if step <= latest)


def _saved(path: str, out: Path, step: int) -> dict[str, Any]:
    if path != "deepspeed":
        engine = ckptlib.CheckpointEngine(output_dir=out, host_cache_size=0.01, handle_signals=False)
        try:
            return engine.load(step).state
        finally:
            engine.shutdown()
    directory = out / f"global_step{step}"
    model = torch.load(directory / "mp_rank_00_model_states.pt", weights_only=False)
    optim = torch.load(directory / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)
    return {"module": model["module"], "ema": model["ema"], "lr_scheduler": model["lr_scheduler"], "optimizer": optim["optimizer_state_dict"]}


def _compare(path: str, directory: Path) -> list[int]:
    """Compares every committed checkpoint with its reference; returns the committed steps."""
    steps = _committed(path, directory / "out")
    for step in steps:
        expected = torch.load(directory / "refs" / f"{step}.pt", weights_only=False)
        saved = _saved(path, directory / "out", step)
        for key, value in expected.items():
            if path == "deepspeed" and key == "optimizer":
                # ZeRO's optimizer state: Adam's state and the fp32 partitions (the rest is
                # bookkeeping objects without equality).
                value = {k: value[k] for k in ("base_optimizer_state", "single_partition_of_fp32_groups")}
                saved[key] = {k: saved[key][k] for k in value}
            assert_same(value, saved[key], f"{path} step {step} {key}")
    return steps


def _last_recorded(directory: Path) -> int:
    return max(int(p.name.removesuffix(".pt")) for p in (directory / "refs").glob("*.pt"))


def _finish_sigterm(path: str, directory: Path, process: subprocess.Popen[str]) -> int:
    _, stderr = process.communicate(timeout=180)
    assert process.returncode == 143, stderr[-4000:]
    steps = _compare(path, directory)
    # The last step the child reached is committed: the final checkpoint (or its own save).
    assert steps and steps[-1] == _last_recorded(directory), (steps[-5:], _last_recorded(directory), stderr[-3000:])
    return len(steps)


@pytest.mark.parametrize("path", PATHS)
def test_every_committed_checkpoint_is_exactly_its_step(path: str, job_env: dict[str, str], tmp_path: Path) -> None:
    if path == "deepspeed":
        pytest.importorskip("deepspeed")
    env = {**job_env, "PYTHONPATH": f"{ckptlib.vendor_path()}{os.pathsep}{REPO_ROOT}"}
    rng = random.Random(f"exactness-{path}")
    counts: dict[str, int] = {}

    # SIGTERM inside optimizer.step() (the child's own), and at a random moment (ours).
    inside, anywhere = tmp_path / "sigterm-inside", tmp_path / "sigterm-anywhere"
    first = _start(path, inside, env, ready_at=0, self_signal_at=rng.randint(26, 34), max_steps=400)
    second = _start(path, anywhere, env, ready_at=26, self_signal_at=0, max_steps=400)
    _wait_ready(second)
    time.sleep(rng.uniform(0.0, 0.3))
    second.send_signal(signal.SIGTERM)
    counts["sigterm inside optimizer.step"] = _finish_sigterm(path, inside, first)
    assert (inside / "refs" / "landed").read_text() == "optimizer.step"
    counts["sigterm at a random moment"] = _finish_sigterm(path, anywhere, second)

    # SIGKILL while a checkpoint persists (one is saved every step).
    killed = tmp_path / "sigkill"
    limit = 1 if path == "trainer" else 0
    third = _start(path, killed, env, ready_at=rng.randint(6, 12), self_signal_at=0, max_steps=400, limit=limit)
    _wait_ready(third)
    time.sleep(rng.uniform(0.0, 0.2))
    third.send_signal(signal.SIGKILL)
    third.communicate(timeout=60)
    steps = _compare(path, killed)
    assert steps, "a SIGKILL left no committed checkpoint"
    if limit:
        # Rotated right after each commit, never before: the kill may fall between the two.
        assert 1 <= len(steps) <= 2, steps
        counts["sigkill (save_total_limit=1)"] = len(steps)
        # A new process resumes from it and goes on checkpointing exactly.
        resumed = _start(
            path, killed, {**env, "CKPT_LAST_STEP": "-1"}, ready_at=0, self_signal_at=0, max_steps=steps[-1] + 3, limit=limit
        )  # fmt: skip
        stdout, stderr = resumed.communicate(timeout=180)
        assert resumed.returncode == 0, stderr[-4000:]
        assert f"resuming from {killed / 'out' / ckptlib.CHECKPOINT_SUBDIR / f'checkpoint-{steps[-1]}'}" in stderr
        assert f"trained {steps[-1] + 3}" in stdout
        counts["after the resume"] = len(after := _compare(path, killed))
        assert after[-1] == steps[-1] + 3 and len(after) <= 2, after
    else:
        counts["sigkill"] = len(steps)

    total = sum(counts.values())
    print(f"\n{path}: {total} checkpoints compared bit for bit, 0 mismatches ({counts})")
    assert total >= MIN_PER_PATH, counts
