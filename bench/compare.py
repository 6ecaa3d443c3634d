"""The side-by-side driver of ``bench.logs.compare`` and ``bench.failover.compare``: a benchmark
on an earlier commit and on this checkout, in one run.

The earlier commit is checked out in a temporary ``git worktree`` and run with this checkout's
venv; the runs alternate (base, this, base, this for ``--rounds 2``), so a change in what else the
machine does skews both alike. Prints each figure per run, its spread over the rounds and the
ratio of this checkout's median to the base's; a figure the base's benchmark does not measure is
shown for this checkout only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_once(module: str, tree: Path, args: list[str], out: Path) -> dict:
    """One ``python -m <module> --json <out> <args>`` in ``tree``; its report ({} if none)."""
    command = [sys.executable, "-m", module, "--json", str(out), *args]
    print(f"$ (in {tree}) {' '.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=tree, env={**os.environ, "PYTHONPATH": str(tree)}, check=False)
    return json.loads(out.read_text()) if out.exists() else {}


def main(
    module: str,
    figures: Callable[[dict], dict[str, float]],
    argv: list[str] | None,
    *,
    doc: str | None,
    number: str = ".3f",
    width: int = 56,
) -> int:
    """``python -m <module>.compare --base <rev> [--rounds N] [<module>'s options]``."""
    p = argparse.ArgumentParser(prog=f"python -m {module}.compare", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", required=True, help="the earlier commit (a git revision)")
    p.add_argument("--rounds", type=int, default=1, help="runs of each, alternating (default 1)")
    known, rest = p.parse_known_args(argv)
    work = Path(tempfile.mkdtemp(prefix=f"{module.replace('.', '-')}-compare-"))
    base_tree = work / "base"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(base_tree), known.base], check=True, capture_output=True)
    runs: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    try:
        for r in range(known.rounds):
            runs["base"].append(figures(run_once(module, base_tree, rest, work / f"base-{r}.json")))
            runs["this"].append(figures(run_once(module, REPO, rest, work / f"this-{r}.json")))
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(base_tree)], check=False, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    names = sorted({name for kind in runs.values() for fig in kind for name in fig})
    print(f"\n=== {module}: {known.base} (base) vs this checkout, {known.rounds} round(s) each, alternating ===")
    print(f"  {'figure':<{width}} {'base':>22} {'this':>22} {'this/base':>9}")
    for name in names:
        cells: list[str] = []
        medians: list[float | None] = []
        for kind in ("base", "this"):
            values = [fig[name] for fig in runs[kind] if name in fig]
            if values:
                median = statistics.median(values)
                spread = f" ({min(values):{number}}–{max(values):{number}})" if len(values) > 1 else ""
                cells.append(f"{median:{number}}{spread}")
                medians.append(median)
            else:
                cells.append("not measured")
                medians.append(None)
        base, this = medians
        ratio = f"{this / base:.2f}x" if base and this is not None else "-"
        print(f"  {name:<{width}} {cells[0]:>22} {cells[1]:>22} {ratio:>9}")
    return 0
