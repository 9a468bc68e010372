"""Medians of paired turns and their bootstrap intervals (pure; the regime matrix and its reader).

A served cell's ratio is the median over its paired turns (a config's tokens/s over `off`'s in
the same batch); how far that median can be trusted takes the cell's own spread. The interval
resamples the turns with replacement (seeded) and takes percentiles of the resampled medians.
A cell reads `under` a bar when its whole interval lies below it, `over` when it lies at or above
it, else `open`.
"""
from __future__ import annotations

import random
from typing import Sequence

__all__ = ["lower_middle", "median_interval", "verdict"]


def lower_middle(values: Sequence[float]) -> float | None:
    """The median of `values` (the lower middle for an even count); None when empty."""
    ranked = sorted(values)
    return ranked[(len(ranked) - 1) // 2] if ranked else None


def median_interval(ratios: Sequence[float], level: float = 0.9, resamples: int = 4000,
                    seed: int = 0) -> tuple[float, float, float] | None:
    """(median, low, high): the lower-middle median of `ratios` and the percentile bootstrap
    interval of it at `level`; None without ratios."""
    if not ratios:
        return None
    rng = random.Random(seed)
    n = len(ratios)
    medians = sorted(lower_middle([ratios[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    low = medians[int(tail * (resamples - 1))]
    high = medians[int((1.0 - tail) * (resamples - 1))]
    return lower_middle(ratios), low, high


def verdict(interval: tuple[float, float, float], bar: float) -> str:
    """`under` (the whole interval below `bar`), `over` (at or above it) or `open`."""
    _, low, high = interval
    return "under" if high < bar else "over" if low >= bar else "open"
