"""Intervals and summaries over seeds: Student-t intervals of means and paired differences, steps to a threshold.

Seeds are the unit of replication: each (arm, seed) run is one sample, and two arms with the same
seed share data order and rollout seed, so differences between arms are taken per seed (paired).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Interval", "steps_to_threshold", "t_interval"]


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` seeds and its two-sided ``level`` Student-t interval (NaN bounds when n < 2)."""

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95

    def text(self, digits: int = 3) -> str:
        if self.n == 0:
            return "n/a"
        if self.n < 2 or math.isnan(self.low):
            return f"{self.mean:.{digits}f} (1 seed)"
        return f"{self.mean:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean of ``values`` with the Student-t interval ``mean ± t_{(1+level)/2, n-1} · s / sqrt(n)``."""
    from scipy import stats

    n = len(values)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, level)
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, level)
    variance = sum((value - mean) ** 2 for value in values) / (n - 1)
    half = float(stats.t.ppf((1 + level) / 2, n - 1)) * math.sqrt(variance / n)
    return Interval(mean, mean - half, mean + half, n, level)


def steps_to_threshold(curve: Sequence[tuple[int, float]], threshold: float) -> int | None:
    """The first evaluated step whose value is ≥ ``threshold`` (``curve``: (step, value) pairs); None if never."""
    for step, value in sorted(curve):
        if value >= threshold:
            return step
    return None
