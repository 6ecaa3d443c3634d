"""Quantiles and formatting (standard library only)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from bench.stats import quantile


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
