"""The cost of the job sandbox: ``python -m bench.sandbox``.

Both sides run the same command the same way a runner does (``bash -c`` in a new session, stdout
piped): once bare, and once as a job runs now, wrapped by ``agent.sandbox.wrap`` with a job's
policy (hidden state directories, its own work and output directories, stand-in GPU devices, a
network namespace of its own) and, where the node allows one, in a cgroup of its own with a CPU
quota of the machine's cores and a 4 GiB memory limit (made, joined and removed per run, as the
runner does). The two are interleaved: each pair runs both, the order flipping from one pair to
the next, so load on the machine hits both alike; each pair's difference is printed with its
spread, beside each side's own.

* start: Popen → the first line the job prints (``python -c 'print(1)'``), ``--starts`` pairs;
* step: the mean time of a small training step (an MLP on the CPU, torch), measured inside the job
  over ``--steps`` steps after a warm-up, ``--rounds`` pairs of runs.

Targets: ≤ 100 ms added to start, ≤ 1 % on step time.
"""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agent import cgroups
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


class Cgroup:
    """A run's own cgroup, as the runner makes one: per run, joined before exec, then removed."""

    def __init__(self) -> None:
        self.hierarchy, self.why = cgroups.hierarchy()
        self.enforced, why = cgroups.support()
        self.why = self.why or why
        self.count = 0

    def make(self) -> list[str]:
        if not self.enforced:
            return []
        self.count += 1
        name = f"sac-bench-{os.getpid()}-{self.count}"  # not a run's name: agents' sweeps leave it alone
        return [str(d) for d in cgroups.create(self.hierarchy, name, cpus=float(os.cpu_count() or 1), memory_mb=4096)]


def launch(argv: list[str], cwd: Path, cgroup: list[str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        preexec_fn=(lambda: cgroups.join_self(cgroup)) if cgroup else None,
    )


def argv_for(command: str, sandbox: dict | None, cwd: Path) -> list[str]:
    argv = ["bash", "-c", command]
    return wrap(argv, policy=sandbox, cwd=str(cwd)) if sandbox else argv


def run_once(command: str, sandbox: dict | None, cwd: Path, cg: Cgroup | None, *, first_line: bool) -> tuple[float, str]:
    """Start ``command`` (in the sandbox and a fresh cgroup when given); the seconds to its first
    line (``first_line``) or to its end, and its last line."""
    t0 = time.perf_counter()
    cgroup = cg.make() if (cg and sandbox) else []
    proc = launch(argv_for(command, sandbox, cwd), cwd, cgroup)
    if first_line:
        line = proc.stdout.readline()
        elapsed = time.perf_counter() - t0
        proc.communicate()
    else:
        out, _ = proc.communicate()
        elapsed, line = time.perf_counter() - t0, out.strip().splitlines()[-1]
    if cgroup:
        cgroups.remove([Path(d) for d in cgroup])
    return elapsed, line.decode().strip()


def interleaved(pairs: int, bare, boxed) -> tuple[list[float], list[float]]:
    """``pairs`` samples of each, the order flipping every pair (bare first, then sandbox first)."""
    a, b = [], []
    for i in range(pairs):
        if i % 2 == 0:
            a.append(bare())
            b.append(boxed())
        else:
            b.append(boxed())
            a.append(bare())
    return a, b


def spread(values: list[float], scale: float, unit: str) -> str:
    values = sorted(v * scale for v in values)
    return (
        f"median {quantile(values, 0.5):.1f} {unit}, p95 {quantile(values, 0.95):.1f}, "
        f"min {values[0]:.1f}, max {values[-1]:.1f} (n={len(values)})"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--starts", type=int, default=30, help="pairs of starts")
    parser.add_argument("--rounds", type=int, default=6, help="pairs of training runs")
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
        cg = Cgroup()
        print(f"load before: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores; sandboxed side: bwrap + own network"
              + (f" + a cgroup {cg.hierarchy.mode} per run" if cg.enforced else f", no cgroup ({cg.why})"))
        command = f"{sys.executable} -c 'print(1)'"
        bare, boxed = interleaved(
            args.starts,
            lambda: run_once(command, None, cwd, None, first_line=True)[0],
            lambda: run_once(command, sandbox, cwd, cg, first_line=True)[0],
        )
        print(f"Start (Popen → first line of `python -c 'print(1)'`), {args.starts} interleaved pairs:")
        print(f"  bare     {spread(bare, 1000, 'ms')}")
        print(f"  sandbox  {spread(boxed, 1000, 'ms')}")
        added = [y - x for x, y in zip(bare, boxed)]
        median_added = statistics.median(added)
        print(f"  added per pair: {spread(added, 1000, 'ms')}")
        print(f"  added: {median_added * 1000:.1f} ms (median of pairs)  [{'PASS' if median_added <= 0.1 else 'FAIL'}: ≤ 100 ms]")
        step = f"{sys.executable} -c {shlex.quote(STEP_SCRIPT)} {args.steps}"
        bare_steps, boxed_steps = interleaved(
            args.rounds,
            lambda: float(run_once(step, None, cwd, None, first_line=False)[1]),
            lambda: float(run_once(step, sandbox, cwd, cg, first_line=False)[1]),
        )
        print(f"Training step (MLP 512-1024-512, AdamW, batch 64, 1 thread; {args.steps} steps a run), {args.rounds} interleaved pairs:")
        print(f"  bare     {spread(bare_steps, 1000, 'ms')}")
        print(f"  sandbox  {spread(boxed_steps, 1000, 'ms')}")
        ratios = [y / x - 1 for x, y in zip(bare_steps, boxed_steps)]
        print(f"  overhead per pair: {spread(ratios, 100, '%')}")
        overhead = statistics.median(ratios)
        print(f"  overhead: {overhead * 100:+.2f} % (median of pairs)  [{'PASS' if overhead <= 0.01 else 'FAIL'}: ≤ 1 %]")
        print(f"load after: {os.getloadavg()[0]:.2f} (1 min)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
