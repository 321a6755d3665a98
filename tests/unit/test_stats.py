"""The one percentile: numpy's default method, and no number for no values."""

from __future__ import annotations

import numpy as np
import pytest
from draftsync.stats import percentile


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
