"""Latency summaries and the median of round medians.

Layer: benchmark. A figure is measured in several rounds interleaved with its baseline, so a
neighbour's burst of CPU on a shared 2-core machine spoils one round of both, not one figure;
the reported value is the median over rounds of each round's statistic.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of already sorted values (0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(0, min(len(sorted_values) - 1, math.ceil(fraction * len(sorted_values)) - 1))
    return float(sorted_values[rank])


def summarize(latencies_ns: Sequence[int], wall_s: float) -> dict[str, float]:
    """p50 and p99 in µs, calls per second over the wall time, and the call count."""
    ordered = sorted(latencies_ns)
    return {
        "p50_us": round(percentile(ordered, 0.50) / 1e3, 1),
        "p99_us": round(percentile(ordered, 0.99) / 1e3, 1),
        "calls_per_s": round(len(ordered) / wall_s, 1) if wall_s > 0 else 0.0,
        "calls": len(ordered),
    }


def combine_rounds(rounds: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Median over rounds of p50, p99 and calls/s; the rounds' p50s are kept for the record."""
    if not rounds:
        return {}
    return {
        "p50_us": round(statistics.median(r["p50_us"] for r in rounds), 1),
        "p99_us": round(statistics.median(r["p99_us"] for r in rounds), 1),
        "calls_per_s": round(statistics.median(r["calls_per_s"] for r in rounds), 1),
        "calls": sum(int(r["calls"]) for r in rounds),
        "rounds": len(rounds),
        "round_p50_us": [r["p50_us"] for r in rounds],
    }


def ratio(value: float, baseline: float) -> float:
    return round(value / baseline, 3) if baseline else float("inf")
