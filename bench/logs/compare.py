"""``python -m bench.logs.compare --base <git rev> [bench.logs options]``: the log benchmark on an
earlier commit and on this checkout, in one run, side by side.

The earlier commit is checked out in a temporary ``git worktree`` and run with this checkout's
venv; the two runs alternate (base, this, base, this for ``--rounds 2``), so a change in what else
the machine does skews both alike. Prints each figure per run, its spread over the rounds and the
ratio of this checkout's median to the base's. A figure the base's benchmark does not measure
(the fairness run is new) is shown for this checkout only.
"""

from __future__ import annotations

import sys

from bench import compare


def figures(report: dict) -> dict[str, float]:
    """The headline figures of one ``bench.logs --json`` report."""
    out: dict[str, float] = {}
    for row in report.get("ingest", []):
        out[f"ingest {row['name']} batch {row['batch']} (lines/s)"] = row["lines_per_s"]
    for label in ("baseline", "full"):
        block = report.get("latency", {}).get(label)
        if block:
            out[f"latency {label} p95 (ms)"] = block["summary_ms"]["p95"]
    for label in ("alone", "loaded"):
        block = report.get("fairness", {}).get(label)
        if block:
            out[f"fairness quiet job {label} p95 (ms)"] = block["summary_ms"]["p95"]
    for name, block in report.get("tail", {}).items():
        out[f"tail {name} 1M p95 (ms)"] = block["big"]["p95"]
    return {k: float(v) for k, v in out.items() if isinstance(v, (int, float))}


def main(argv: list[str] | None = None) -> int:
    return compare.main("bench.logs", figures, argv, doc=__doc__, number=",.0f", width=64)


if __name__ == "__main__":
    sys.exit(main())
