"""Validation plots: both PNGs are written, are real PNGs, and read back as images of a sensible size."""

from __future__ import annotations

from dataclasses import replace

import pytest
from draftsync.errors import DraftsyncError
from draftsync.validation.plots import (
    ACCEPTANCE_BY_POSITION,
    ACCEPTANCE_VS_GAMMA,
    plot_acceptance_by_position,
    plot_acceptance_vs_gamma,
    write_validation_plots,
)

from tests.unit.validation.test_validation_result import sample_validation

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def sweep_rows() -> list[dict]:
    """A sweep shaped like a real one: acceptance falls with gamma, TPOT has a minimum at gamma 4."""
    tpot = {2: 9.0, 3: 8.1, 4: 7.6, 5: 7.9, 6: 8.4, 7: 9.0, 8: 9.7}
    return [
        {"gamma": g, "acceptance_rate": 0.9 - 0.06 * g, "mean_acceptance_length": 1 + 0.7 * g**0.8, "tpot_ms": tpot[g]}
        for g in range(2, 9)
    ]


def assert_png(path) -> None:
    import matplotlib.image

    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and len(data) > 0
    pixels = matplotlib.image.imread(path)
    height, width = pixels.shape[:2]
    assert height >= 300 and width >= 400
    assert pixels.std() > 0  # something was drawn, not a blank canvas


def test_both_plots_are_written_as_readable_pngs(tmp_path):
    per_position = [0.82, 0.61, 0.44, 0.30]

    checklist = replace(
        sample_validation().checklist,
        gamma_sweep=sweep_rows(),
        acceptance_by_position=per_position,
        sweep_plain_tpot_ms=10.2,
        gamma_knee=4,
        knee_reason="the fastest TPOT",
    )

    paths = write_validation_plots(tmp_path / "plots", checklist)

    assert paths == {
        "acceptance_vs_gamma": tmp_path / "plots" / ACCEPTANCE_VS_GAMMA,
        "acceptance_by_position": tmp_path / "plots" / ACCEPTANCE_BY_POSITION,
    }
    for path in paths.values():
        assert_png(path)


def test_gaps_in_a_sweep_and_an_explicit_knee_still_plot(tmp_path):
    rows = sweep_rows()
    rows.insert(0, {"gamma": 0, "acceptance_rate": None, "mean_acceptance_length": 1.0, "tpot_ms": 10.2})

    path = plot_acceptance_vs_gamma(list(reversed(rows)), tmp_path, knee=3)

    assert_png(path)


def test_bad_input_names_the_thing_and_the_fix(tmp_path):
    with pytest.raises(DraftsyncError, match="sweep is empty"):
        plot_acceptance_vs_gamma([], tmp_path)
    with pytest.raises(DraftsyncError, match=r"lacks \['tpot_ms'\]"):
        plot_acceptance_vs_gamma([{"gamma": 2, "acceptance_rate": 0.8, "mean_acceptance_length": 2.4}], tmp_path)
    with pytest.raises(DraftsyncError, match="outside"):
        plot_acceptance_by_position([3.2, 1.1], tmp_path)  # accepted counts, not rates
    with pytest.raises(DraftsyncError, match="no per-position"):
        plot_acceptance_by_position([], tmp_path)
    assert not any(tmp_path.iterdir())
