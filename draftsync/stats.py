"""Statistics that more than one layer reports: one definition, so validation and the monitors agree."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between the closest ranks (numpy's default method).

    None for no values: a percentile of nothing is not a number, and each caller shows that in its own way
    (the checklist as NaN, a gate not measured; the weekly report as null)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
