"""Small statistics and table helpers (standard library only)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.stats import quantile


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


def p95(values: Sequence[float]) -> float:
    return quantile(values, 0.95)


def fmt_s(value: float | None, width: int = 7) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-".rjust(width)
    return f"{value:{width}.3f}"


def table(rows: list[tuple[str, Sequence[float]]], *, title: str) -> str:
    """Rows of (phase name, samples in seconds) → median / p95 / min / max / n table."""
    name_w = max(len(r[0]) for r in rows) if rows else 10
    out = [title, f"  {'phase'.ljust(name_w)}  {'median':>7}  {'p95':>7}  {'min':>7}  {'max':>7}  {'n':>3}"]
    for name, samples in rows:
        clean = [s for s in samples if s is not None]
        lo = min(clean) if clean else None
        hi = max(clean) if clean else None
        out.append(f"  {name.ljust(name_w)}  {fmt_s(median(clean))}  {fmt_s(p95(clean))}  {fmt_s(lo)}  {fmt_s(hi)}  {len(clean):>3}")
    return "\n".join(out)
