"""``python -m bench.ckpt.compare --base <git rev>``: ckptlib's blocking per save, persist time and
step-time overhead on an earlier commit and on this checkout, in one run, side by side.

The earlier commit's ``ckptlib`` is checked out in a temporary ``git worktree``; both are driven by
this checkout's ``bench.ckpt`` worker (the same model, training loop and clock; only the package
under test differs), each run in a fresh process. The runs alternate (base, this, [this in other
copy modes], base, this, ... for ``--rounds``), so what else the machine does skews each alike.

Blocking per save is what the training thread waited for one checkpoint: inside ``save`` ("save
call") plus optimizer steps held by the pre-step hook and staging at hook points ("at hooks").
Printed per variant over every save of every round: median, mean, p90 and min–max, and the
ratio of this checkout's median (and mean) to the base's; persist seconds likewise; the step-time
overhead of the windows with a checkpoint over those without (``bench.ckpt``'s paired windows),
pooled, with each run's figure in brackets.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.ckpt.__main__ import RunFigures, _paired_overhead, _steps, _worker_figures
from bench.stats import quantile

REPO = Path(__file__).resolve().parents[2]


def _run(tree: Path | None, copy_mode: str | None, options: argparse.Namespace, work: Path) -> RunFigures:
    out = Path(tempfile.mkdtemp(prefix="run-", dir=work))
    command = [
        sys.executable, "-m", "bench.ckpt", "--worker", "ckptlib", "--out", str(out),
        "--size-gb", str(options.size_gb), "--cycles", str(options.cycles),
        "--every", str(options.every), "--batch", str(options.batch),
    ]  # fmt: skip
    if tree is not None:
        command += ["--ckptlib-from", str(tree)]
    if copy_mode is not None:
        command += ["--copy-mode", copy_mode]
    env = {**os.environ, "PYTHONPATH": str(REPO), "THP_MEM_ALLOC_ENABLE": "1"}
    if options.allocator != "glibc":
        env["LD_PRELOAD"] = " ".join(filter(None, [options.allocator, env.get("LD_PRELOAD", "")]))
    return _worker_figures(command, env, out, f"the run of {tree or 'this checkout'}", cwd=REPO)


def _summary(values: list[float], digits: int = 4) -> str:
    if not values:
        return "none"
    return (
        f"median {statistics.median(values):.{digits}f}  mean {statistics.fmean(values):.{digits}f}  "
        f"p90 {quantile(values, 0.9):.{digits}f}  min–max {min(values):.{digits}f}–{max(values):.{digits}f}"
    )


def report(runs: dict[str, list[RunFigures]], options: argparse.Namespace) -> str:
    """The side-by-side table (variants in insertion order, the first is the base)."""
    lines = [
        (
            f"bench.ckpt.compare: {options.base} (base) vs this checkout; {options.rounds} round(s), alternating; "
            f"size {options.size_gb} GB, one checkpoint per {options.every} steps, {options.cycles} with/without "
            f"pairs per run ({_steps(options.every, options.cycles)} steps), batch {options.batch}, "
            f"THP_MEM_ALLOC_ENABLE=1, allocator {options.allocator}"
        ),
    ]
    medians: dict[str, tuple[float, float]] = {}
    for name, group in runs.items():
        blocking = [b for run in group for b in run.blocking_s]
        calls = [c for run in group for c in run.save_call_s]
        hooks = [b - c for run in group for b, c in zip(run.blocking_s, run.save_call_s, strict=False)]
        persist = [p for run in group for p in run.persist_s]
        pooled, per_run = _paired_overhead(group, options.every)
        medians[name] = (statistics.median(blocking), statistics.fmean(blocking)) if blocking else (float("nan"),) * 2
        lines += [
            "",
            f"{name}: {len(blocking)} saves in {len(group)} runs",
            f"  blocking per save (s)  {_summary(blocking)}",
            f"    in the save call     {_summary(calls)}",
            f"    at hooks after it    {_summary(hooks)}",
            f"  persist (s)            {_summary(persist, 3)}",
            f"  step-time overhead     {pooled:+.2f} % pooled  [{' '.join(f'{v:+.1f}' for v in per_run)}]",
        ]
    base = next(iter(medians))
    lines.append("")
    for name, (median, mean) in medians.items():
        if name != base:
            lines.append(f"{name} / {base}: blocking median {median / medians[base][0]:.2f}x, mean {mean / medians[base][1]:.2f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ckpt.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", required=True, help="the earlier commit (a git revision)")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant, alternating (default 3)")
    parser.add_argument("--size-gb", type=float, default=0.25, help="parameters + optimizer state, GB (default 0.25)")
    parser.add_argument("--every", type=int, default=3, help="one checkpoint per N steps (default 3)")
    parser.add_argument("--cycles", type=int, default=8, help="saves per run (default 8)")
    parser.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    parser.add_argument(
        "--modes", default="checked",
        help="this checkout's copy modes to run, comma-separated (default: checked; e.g. checked,lazy)",
    )  # fmt: skip
    parser.add_argument("--allocator", default=None, help="glibc, or a malloc library to preload (default: jemalloc)")
    options = parser.parse_args(argv)
    if options.allocator is None:
        import ctypes.util

        options.allocator = ctypes.util.find_library("jemalloc") or "glibc"
    modes = [mode.strip() for mode in options.modes.split(",") if mode.strip()]
    work = Path(tempfile.mkdtemp(prefix="bench-ckpt-compare-"))
    base_tree = work / "base"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_tree), options.base], check=True, capture_output=True)
    runs: dict[str, list[RunFigures]] = {"base": [], **{f"this ({mode})": [] for mode in modes}}
    try:
        for round_index in range(options.rounds):
            runs["base"].append(_run(base_tree, None, options, work))
            for mode in modes:
                runs[f"this ({mode})"].append(_run(None, mode, options, work))
            print(f"round {round_index + 1}/{options.rounds} done", flush=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(report(runs, options))
    return 0


if __name__ == "__main__":
    sys.exit(main())
