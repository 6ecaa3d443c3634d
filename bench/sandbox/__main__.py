"""The cost of the job sandbox: ``python -m bench.sandbox``.

Both sides run the same command the same way a runner does (``bash -c`` in a new session, stdout
piped), once bare and once wrapped by ``agent.sandbox.wrap`` with a job's policy (hidden state
directories, its own work and output directories, stand-in GPU devices). Runs alternate, so load
on the machine hits both alike.

* start: Popen → the first line the job prints (``python -c 'print(1)'``), ``--starts`` samples each;
* step: the mean time of a small training step (an MLP on the CPU, torch), measured inside the job
  over ``--steps`` steps after a warm-up, ``--rounds`` runs each.

Targets: ≤ 100 ms added to start, ≤ 1 % on step time.
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent.sandbox import availability, bwrap_path, gpu_devices, wrap
from bench.stats import quantile

STEP_SCRIPT = """
import sys, time, torch
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512))
opt = torch.optim.AdamW(model.parameters())
x = torch.randn(64, 512)
steps = int(sys.argv[1])
for i in range(steps + 10):
    if i == 10:
        start = time.perf_counter()
    opt.zero_grad()
    model(x).square().mean().backward()
    opt.step()
print((time.perf_counter() - start) / steps, flush=True)
"""


def policy(root: Path) -> dict:
    (root / "var").mkdir(exist_ok=True)
    (root / "jobs" / "1" / "work").mkdir(parents=True, exist_ok=True)
    (root / "jobs" / "1" / "output").mkdir(parents=True, exist_ok=True)
    devices = root / "dev"
    devices.mkdir(exist_ok=True)
    for name in ("nvidia0", "nvidia1", "nvidiactl"):
        (devices / name).touch()
    return {
        "bwrap": bwrap_path(),
        "hidden": [str(root / "var"), str(root / "jobs")],
        "readonly": [sys.prefix],
        "writable": [str(root / "jobs" / "1" / "work"), str(root / "jobs" / "1" / "output")],
        "devices": gpu_devices([0], device_dir=str(devices)),
        "home": "/tmp",
    }


def launch(argv: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)


def argv_for(command: str, sandbox: dict | None, cwd: Path) -> list[str]:
    argv = ["bash", "-c", command]
    return wrap(argv, policy=sandbox, cwd=str(cwd)) if sandbox else argv


def time_start(command: str, sandbox: dict | None, cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = launch(argv_for(command, sandbox, cwd), cwd)
    proc.stdout.readline()
    elapsed = time.perf_counter() - t0
    proc.wait()
    return elapsed


def step_time(steps: int, sandbox: dict | None, cwd: Path) -> float:
    proc = launch(argv_for(f"{sys.executable} -c {shlex.quote(STEP_SCRIPT)} {steps}", sandbox, cwd), cwd)
    out, _ = proc.communicate()
    return float(out.decode().strip().splitlines()[-1])


def spread(values: list[float], scale: float, unit: str) -> str:
    values = sorted(v * scale for v in values)
    return (
        f"median {quantile(values, 0.5):.1f} {unit}, p95 {quantile(values, 0.95):.1f}, "
        f"min {values[0]:.1f}, max {values[-1]:.1f} (n={len(values)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    ready, why = availability()
    if not ready:
        print(f"cannot measure: {why}")
        return 2
    root = Path(tempfile.mkdtemp(prefix="bench-sandbox-"))
    try:
        sandbox = policy(root)
        cwd = root / "jobs" / "1" / "work"
        command = f"{sys.executable} -c 'print(1)'"
        bare, boxed = [], []
        for _ in range(args.starts):
            bare.append(time_start(command, None, cwd))
            boxed.append(time_start(command, sandbox, cwd))
        print("Start (Popen → first line of `python -c 'print(1)'`), alternating:")
        print(f"  bare     {spread(bare, 1000, 'ms')}")
        print(f"  sandbox  {spread(boxed, 1000, 'ms')}")
        added = statistics.median(boxed) - statistics.median(bare)
        print(f"  added: {added * 1000:.1f} ms (median vs median)  [{'PASS' if added <= 0.1 else 'FAIL'}: ≤ 100 ms]")
        bare_steps, boxed_steps = [], []
        for _ in range(args.rounds):
            bare_steps.append(step_time(args.steps, None, cwd))
            boxed_steps.append(step_time(args.steps, sandbox, cwd))
        print(f"Training step (MLP 512-1024-512, AdamW, batch 64, 1 thread; {args.steps} steps a run), alternating runs:")
        print(f"  bare     {spread(bare_steps, 1000, 'ms')}")
        print(f"  sandbox  {spread(boxed_steps, 1000, 'ms')}")
        ratio = statistics.mean(boxed_steps) / statistics.mean(bare_steps) - 1
        print(f"  overhead: {ratio * 100:+.2f} % (mean vs mean)  [{'PASS' if ratio <= 0.01 else 'FAIL'}: ≤ 1 %]")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
