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


def predicted_acceptance(
    requests: Sequence[tuple[int, int]], window_draft_tokens: int, draws: int = 2000, level: float = 0.90, seed: int = 0
) -> dict[str, tuple[float, float, float]] | None:
    """What serving should measure over a window of `window_draft_tokens` drafted tokens, from validated requests'
    (accepted, drafted) counts: {figure: (point, low, high)} for the pooled mean and the per-request P50 and P5.

    A served figure misses validation's for two reasons, and the interval carries both: validation saw a sample of
    the traffic (resampling its requests stands for the traffic it did not see), and serving averages over a window
    of its own (a window's worth of requests drawn from that resample). The interval holds `level` of such draws.
    None when no request drafted: nothing to predict from."""
    import random

    drafted = [(a, d) for a, d in requests if d > 0]
    if not drafted:
        return None
    per_request = sum(d for _, d in drafted) / len(drafted)
    window = max(1, math.ceil(window_draft_tokens / per_request))
    rng = random.Random(seed)
    figures: dict[str, list[float]] = {"mean": [], "p50": [], "p5": []}
    for _ in range(draws):
        population = rng.choices(drafted, k=len(drafted))
        served = rng.choices(population, k=window)
        rates = [a / d for a, d in served]
        figures["mean"].append(sum(a for a, _ in served) / sum(d for _, d in served))
        figures["p50"].append(percentile(rates, 50) or 0.0)
        figures["p5"].append(percentile(rates, 5) or 0.0)
    rates = [a / d for a, d in drafted]
    points = {
        "mean": sum(a for a, _ in drafted) / sum(d for _, d in drafted),
        "p50": percentile(rates, 50) or 0.0,
        "p5": percentile(rates, 5) or 0.0,
    }
    tail = (1.0 - level) / 2 * 100
    return {
        name: (points[name], percentile(values, tail) or 0.0, percentile(values, 100 - tail) or 0.0)
        for name, values in figures.items()
    }
