"""``python -m bench.failover.compare --base <git rev> [--rounds N] [bench.failover options]``: the
failover benchmark on an earlier commit and on this checkout, in one run, side by side.

With ``bench.compare`` (as ``bench.logs.compare``): the earlier commit is checked out in a temporary ``git worktree`` and run
with this checkout's venv; the runs alternate (base, this, base, this for ``--rounds 2``), so what
else the machine does skews both alike. Prints each figure per kind, its spread over the rounds
and the ratio of this checkout's median to the base's.
"""

from __future__ import annotations

import sys

from bench import compare


def figures(report: dict) -> dict[str, float]:
    """The headline figures of one ``bench.failover --json`` report."""
    out: dict[str, float] = {}
    for phase, block in report.get("latency", {}).get("summary", {}).items():
        for stat in ("median", "p95"):
            if isinstance(block.get(stat), (int, float)):
                out[f"latency {phase} {stat} (s)"] = block[stat]
    goodput = report.get("goodput", {})
    if isinstance(goodput.get("ratio"), (int, float)):
        out["goodput (faulted / fault-free steps)"] = goodput["ratio"]
    return {k: float(v) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    return compare.main("bench.failover", figures, argv, doc=__doc__, number=".3f", width=56)


if __name__ == "__main__":
    sys.exit(main())
