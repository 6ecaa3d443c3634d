"""Small statistics helpers (standard library only)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.stats import quantile


def summary_ms(values_s: Sequence[float]) -> dict[str, float]:
    """Seconds → {median, p95, p99, min, max} in milliseconds, plus n."""
    ms = [v * 1000.0 for v in values_s]
    return {
        "median": quantile(ms, 0.5),
        "p95": quantile(ms, 0.95),
        "p99": quantile(ms, 0.99),
        "min": min(ms) if ms else math.nan,
        "max": max(ms) if ms else math.nan,
        "n": len(ms),
    }


def fmt(value: float, width: int = 8, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-".rjust(width)
    return f"{value:{width}.{digits}f}"


def ratio(value: float, base: float) -> str:
    if not base or math.isnan(base) or value is None or math.isnan(value):
        return "-"
    return f"{value / base:.2f}x"
