"""The documentation's Spot script and the plain example run as a job runs them: a fresh process."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ckptlib
from ckptlib.tests.conftest import EXAMPLES, REPO_ROOT

SPOT = str(EXAMPLES / "spot_train.py")


def _run(command: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    completed = subprocess.run(command, check=False, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-6000:]
    return completed


def _commits(output: str) -> list[int]:
    return [event.step for line in output.splitlines() if (event := ckptlib.parse_commit_line(line))]


def _spot_env(job_env: dict[str, str], assets: dict[str, str], **extra: str) -> dict[str, str]:
    return {**job_env, "SPOT_ASSETS_DIR": assets["root"], "SPOT_MAX_LENGTH": "32", **extra}


@pytest.mark.slow  # a training process of its own
def test_vendor_path_is_printed_and_imports_datastates(job_env: dict[str, str], tmp_path: Path) -> None:
    printed = _run([sys.executable, "-m", "ckptlib", "vendor-path"], cwd=tmp_path, env=job_env).stdout.strip()
    assert printed == ckptlib.vendor_path() and Path(printed, "datastates", "llm", "__init__.py").is_file()
    code = "from datastates.llm import DecoratedCheckpointing; import ckptlib; print(DecoratedCheckpointing is ckptlib.DecoratedCheckpointing)"
    assert _run([sys.executable, "-c", code], cwd=tmp_path, env=job_env).stdout.strip() == "True"


@pytest.mark.slow
def test_the_spot_script_trains_checkpoints_and_resumes(job_env: dict[str, str], offline_assets: dict[str, str], tmp_path: Path) -> None:
    env = _spot_env(job_env, offline_assets, SPOT_MAX_STEPS="6", SPOT_SAVE_STEPS="3")
    first = _run([sys.executable, SPOT], cwd=tmp_path, env=env)
    assert _commits(first.stderr) == [3, 6]
    root = tmp_path / "results" / "concurrent_checkpoint"
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json"} <= {p.name for p in (root / "checkpoint-6").iterdir()}

    resumed = _run([sys.executable, SPOT], cwd=tmp_path, env={**env, "SPOT_MAX_STEPS": "9", "CKPT_LAST_STEP": "-1"})
    assert f"resuming from {root / 'checkpoint-6'}" in resumed.stderr
    assert _commits(resumed.stderr) == [9]
    state = json.loads((root / "checkpoint-9" / "trainer_state.json").read_text())
    assert state["global_step"] == 9


@pytest.mark.slow
def test_the_spot_script_without_a_checkpoint_starts_from_scratch(job_env: dict[str, str], offline_assets: dict[str, str], tmp_path: Path) -> None:
    env = _spot_env(job_env, offline_assets, SPOT_MAX_STEPS="2", SPOT_SAVE_STEPS="100", CKPT_LAST_STEP="-1")
    completed = _run([sys.executable, SPOT], cwd=tmp_path, env=env)
    assert "[Concurrent Checkpoint] No Checkpoint found with step: -1" in completed.stderr
    assert _commits(completed.stderr) == [2]  # the final checkpoint at exit


def _transformers_version() -> tuple[int, ...]:
    try:
        from importlib.metadata import version

        return tuple(int(part) for part in version("transformers").split(".")[:2])
    except Exception:  # not installed, or a version string of another shape
        return (0,)


@pytest.mark.slow
@pytest.mark.skipif(
    _transformers_version() < (5, 24),
    reason="transformers 5.10.2 (the guide's pin) resumes a CPU multi-process run with "
    "torch.load(map_location='cpu:0'), which torch refuses for any file, its own included "
    '("don\'t know how to restore data location … cpu:0"); 5.24.0 resumes',
)
def test_the_spot_script_under_accelerate_launch_with_two_processes(job_env: dict[str, str], offline_assets: dict[str, str], tmp_path: Path) -> None:
    # On a machine without GPUs, `accelerate launch --num_processes 2` alone starts one process;
    # --multi_gpu with ACCELERATE_USE_CPU starts two, which then train with DDP over gloo.
    accelerate = str(Path(sys.executable).with_name("accelerate"))
    command = [accelerate, "launch", "--multi_gpu", "--num_processes", "2", "--main_process_port", "29517", SPOT]
    env = _spot_env(job_env, offline_assets, SPOT_MAX_STEPS="4", SPOT_SAVE_STEPS="2", ACCELERATE_USE_CPU="true")
    first = _run(command, cwd=tmp_path, env=env)
    assert _commits(first.stderr) == [2, 4]
    root = tmp_path / "results" / "concurrent_checkpoint"
    files = {p.name for p in (root / "checkpoint-4").iterdir()}
    assert {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth"} <= files
    assert json.loads((root / "checkpoint-4" / "ckptlib.json").read_text())["world_size"] == 2

    resumed = _run(command, cwd=tmp_path, env={**env, "SPOT_MAX_STEPS": "6", "CKPT_LAST_STEP": "-1"})
    assert f"resuming from {root / 'checkpoint-4'}" in resumed.stderr
    assert _commits(resumed.stderr) == [6]


@pytest.mark.slow
def test_sigterm_takes_a_final_checkpoint_and_exits(job_env: dict[str, str], offline_assets: dict[str, str], tmp_path: Path) -> None:
    env = _spot_env(job_env, offline_assets, SPOT_MAX_STEPS="100000", SPOT_SAVE_STEPS="100000")
    process = subprocess.Popen([sys.executable, SPOT], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert process.stdout is not None
    output = []
    for line in process.stdout:
        output.append(line)
        if "'loss'" in line:  # logging_steps=2: training is under way
            break
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=120)
    output.append(rest)
    text = "".join(output)
    assert process.returncode == 143, text[-3000:]
    [final] = _commits(text)
    assert final >= 2
    assert ckptlib.read_latest(tmp_path / "results" / "concurrent_checkpoint") == final


@pytest.mark.slow  # a training process of its own
def test_the_plain_example_resumes_where_it_stopped(job_env: dict[str, str], tmp_path: Path) -> None:
    command = [sys.executable, str(EXAMPLES / "plain_pytorch.py"), "--output-dir", str(tmp_path / "out")]
    env = {**job_env, "PYTHONPATH": str(REPO_ROOT)}
    first = _run([*command, "--steps", "20", "--save-every", "10"], cwd=tmp_path, env=env)
    assert _commits(first.stderr) == [10, 20]
    second = _run([*command, "--steps", "30", "--save-every", "10"], cwd=tmp_path, env=env)
    assert "resumed from step 20" in second.stdout
    assert _commits(second.stderr) == [30]
