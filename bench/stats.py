"""Percentiles and medians, kept to the standard library."""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of already sorted values (``q`` in 0..100); NaN when empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q / 100.0 * len(sorted_values)))
    return float(sorted_values[min(rank, len(sorted_values)) - 1])


def median(values: Sequence[float]) -> float:
    vals = [v for v in values if not math.isnan(v)]
    return statistics.median(vals) if vals else math.nan


def step_p50_us(step: Callable[[], object], seconds: float, warmup: int = 100) -> float:
    """Median microseconds of ``step()`` run back to back for ``seconds`` after a warm-up."""
    for _ in range(warmup):
        step()
    gc.collect()
    lat: list[int] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter_ns()
        step()
        lat.append(time.perf_counter_ns() - t)
    lat.sort()
    return lat[len(lat) // 2] / 1000.0
