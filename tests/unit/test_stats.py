"""The one percentile: numpy's default method, and no number for no values."""

from __future__ import annotations

import numpy as np
import pytest
from draftsync.stats import percentile, predicted_acceptance


def test_percentile_interpolates_linearly_between_ranks():
    assert percentile([0.1, 0.2, 0.3, 0.4, 0.5], 50) == pytest.approx(0.3)
    assert percentile([0.0, 1.0], 5) == pytest.approx(0.05)
    assert percentile([0.7], 99) == 0.7


def test_percentile_is_numpys_default():
    """The validation docs and the Great Expectations suite both say numpy's linear percentile."""
    values = np.random.default_rng(3).random(37).tolist()
    for q in (0, 5, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


def test_no_values_have_no_percentile():
    assert percentile([], 50) is None


def _served_window(rng: np.random.Generator, rates: np.ndarray, drafted: int, requests: int) -> float:
    """A served window: `requests` requests of the population, each drafting `drafted` tokens at its own rate."""
    picked = rng.choice(rates, size=requests)
    return float(rng.binomial(drafted, picked).sum() / (drafted * requests))


def test_the_predicted_interval_holds_about_its_level_of_served_windows():
    """Validation sees 40 requests of a population whose per-request rates spread from 0.3 to 1; serving then
    averages windows of 600 drafted tokens. Over 200 validations, the 90 % interval holds the served window of
    its own population about 90 % of the time (the bootstrap is approximate for a sample of 40: 80-97 %)."""
    rng = np.random.default_rng(7)
    population = rng.beta(4, 1.5, size=5000).clip(0.3, 1.0)
    drafted = 20
    held = 0
    for trial in range(200):
        validated = [(int(rng.binomial(drafted, r)), drafted) for r in rng.choice(population, size=40)]
        predicted = predicted_acceptance(validated, 600, draws=400, seed=trial)
        assert predicted is not None
        _, low, high = predicted["mean"]
        held += low <= _served_window(rng, population, drafted, 30) <= high
    assert 160 <= held <= 194


def test_the_interval_narrows_as_the_served_window_grows_and_carries_each_gate_figure():
    requests = [(a, 20) for a in (20, 18, 17, 15, 12, 19, 20, 8, 16, 14)]
    short = predicted_acceptance(requests, 40, seed=1)
    long = predicted_acceptance(requests, 4000, seed=1)
    assert short is not None and long is not None
    assert set(short) == {"mean", "p50", "p5"}
    point = sum(a for a, _ in requests) / sum(d for _, d in requests)
    for figures in (short, long):
        assert figures["mean"][0] == pytest.approx(point)
        for name, (value, low, high) in figures.items():
            assert low <= value <= high, name
    assert long["mean"][2] - long["mean"][1] < short["mean"][2] - short["mean"][1]


def test_requests_that_agree_predict_their_own_rate_and_no_drafts_predict_nothing():
    assert predicted_acceptance([(15, 20)] * 8, 100) == {name: (0.75, 0.75, 0.75) for name in ("mean", "p50", "p5")}
    assert predicted_acceptance([(0, 0), (0, 0)], 100) is None
