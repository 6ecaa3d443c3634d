"""Quantiles and formatting (standard library only)."""
from __future__ import annotations

import math
from collections.abc import Sequence


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile, linear between order statistics (numpy's default); NaN if empty."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def summary(values: Sequence[float]) -> dict[str, float]:
    xs = [v for v in values if v is not None]
    return {
        "n": len(xs),
        "p50": quantile(xs, 0.5),
        "p95": quantile(xs, 0.95),
        "p99": quantile(xs, 0.99),
        "max": max(xs) if xs else math.nan,
    }


def ms(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value * 1000:.0f}"


def ratio(a: float, b: float) -> str:
    if not b or math.isnan(a) or math.isnan(b):
        return "-"
    return f"{a / b:.2f}x"
