"""The validation plots logged with a drafter version: acceptance vs gamma, and acceptance by draft position.

People decide on a drafter from these two pictures: where more draft tokens stop paying (the knee of
the gamma sweep, where TPOT is lowest) and how fast acceptance decays along the draft. Figures are drawn
on matplotlib's Agg canvas directly (no pyplot), so plotting never touches a display or global state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    from draftsync.validation.result import ChecklistResult

ACCEPTANCE_VS_GAMMA = "acceptance_vs_gamma.png"
ACCEPTANCE_BY_POSITION = "acceptance_by_position.png"
SWEEP_KEYS = ("gamma", "mean_acceptance_length", "acceptance_rate", "tpot_ms")
DPI = 120


def _number(value) -> float:
    return math.nan if value is None else float(value)


def _check_sweep(sweep: Sequence[dict]) -> list[dict]:
    if not sweep:
        raise DraftsyncError("the gamma sweep is empty", "run the sweep over at least one gamma before plotting it")
    for row in sweep:
        missing = [key for key in SWEEP_KEYS if key not in row]
        if missing:
            raise DraftsyncError(
                f"gamma sweep row {row!r} lacks {missing}", f"give every row the keys {list(SWEEP_KEYS)}"
            )
    return sorted(sweep, key=lambda row: int(row["gamma"]))


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


# The sweep times a subset of the validation requests at each gamma; the gates' TPOT (`tpot_ms` in the tags) is the
# whole validation set's at the served gamma. Named apart, so two figures of one thing never seem to disagree.
SWEEP_TPOT_TITLE = "Sweep TPOT: time per output token on the sweep's requests (lower is better)"


def plot_acceptance_vs_gamma(
    sweep: Sequence[dict],
    out_dir: str | Path,
    knee: int | None = None,
    plain_tpot_ms: float | None = None,
    fastest: int | None = None,
    knee_reason: str = "",
) -> Path:
    """Acceptance rate and mean acceptance length (top) and TPOT (bottom, its own axis) against gamma.

    `sweep`: rows {gamma, mean_acceptance_length, acceptance_rate, tpot_ms}. `knee`: the chosen gamma
    (default: `checklist.gamma_knee(sweep)`, the best TPOT with near-ties to the smaller gamma); it is
    marked on both panels as the served gamma. `plain_tpot_ms`, when given, draws TPOT without speculation for
    reference; `fastest`, the gamma of the best TPOT, is marked apart when it is not the one served, and
    `knee_reason` says under the panels why the served one was chosen.
    Long: one figure, drawn axis by axis."""
    rows = _check_sweep(sweep)
    if knee is None:
        from draftsync.validation.checklist import gamma_knee

        knee = gamma_knee(rows)
    gammas = [int(row["gamma"]) for row in rows]
    rates = [_number(row["acceptance_rate"]) for row in rows]
    lengths = [_number(row["mean_acceptance_length"]) for row in rows]
    tpots = [_number(row["tpot_ms"]) for row in rows]

    figure = _figure(7.5, 6.5)
    top, bottom = figure.subplots(2, 1, sharex=True, height_ratios=[3, 2])
    figure.suptitle("Acceptance and TPOT vs gamma (draft tokens per step)", fontsize=12)

    rate_line = top.plot(gammas, rates, "o-", color="tab:blue", label="acceptance rate (accepted / drafted)")
    top.set_ylabel("acceptance rate", color="tab:blue")
    top.set_ylim(0.0, 1.05)
    top.tick_params(axis="y", colors="tab:blue")
    top.grid(True, alpha=0.3)
    length_axis = top.twinx()
    length_line = length_axis.plot(
        gammas, lengths, "s--", color="tab:green", label="mean acceptance length (tokens / step)"
    )
    length_axis.set_ylabel("mean acceptance length (tokens / step)", color="tab:green")
    length_axis.set_ylim(1.0, max([1.0 + max(gammas)] + [v for v in lengths if not math.isnan(v)]) + 0.2)
    length_axis.tick_params(axis="y", colors="tab:green")
    top.set_title("Acceptance")

    tpot_lines = bottom.plot(gammas, tpots, "D-", color="tab:red", label="TPOT with speculation")
    if plain_tpot_ms is not None and not math.isnan(plain_tpot_ms):
        tpot_lines += [
            bottom.axhline(
                plain_tpot_ms, color="gray", linestyle=":", label=f"TPOT without speculation ({plain_tpot_ms:.2f} ms)"
            )
        ]
    bottom.set_ylabel("sweep TPOT (ms / output token)")
    bottom.set_xlabel("gamma (draft tokens per step)")
    bottom.set_title(SWEEP_TPOT_TITLE)
    bottom.grid(True, alpha=0.3)
    bottom.set_xticks(gammas)

    knee_row = next((row for row in rows if int(row["gamma"]) == knee), None)
    for axis in (top, bottom):
        axis.axvline(knee, color="black", linestyle="--", linewidth=1, alpha=0.6)
    if knee_row is not None and not math.isnan(_number(knee_row["tpot_ms"])):
        knee_tpot = _number(knee_row["tpot_ms"])
        bottom.plot([knee], [knee_tpot], marker="*", markersize=16, color="black", linestyle="none")
        bottom.annotate(
            f"served: gamma {knee}, {knee_tpot:.2f} ms",
            (knee, knee_tpot),
            xytext=(8, 10),
            textcoords="offset points",
            fontsize=9,
        )
    fastest_row = next((row for row in rows if int(row["gamma"]) == fastest), None)
    if fastest_row is not None and fastest != knee and not math.isnan(_number(fastest_row["tpot_ms"])):
        fastest_tpot = _number(fastest_row["tpot_ms"])
        bottom.plot([fastest], [fastest_tpot], marker="v", markersize=11, color="tab:orange", linestyle="none")
        bottom.annotate(
            f"fastest: gamma {fastest}, {fastest_tpot:.2f} ms",
            (fastest, fastest_tpot),
            xytext=(-10, 8),
            textcoords="offset points",
            ha="right",
            fontsize=9,
        )
    if knee_reason:
        import textwrap

        why = "\n".join(textwrap.wrap(f"Served: gamma {knee}, because {knee_reason}.", 80))
        bottom.set_title(f"{SWEEP_TPOT_TITLE}\n{why}", fontsize=9)
    top.legend(handles=rate_line + length_line, loc="lower left", fontsize=8)
    bottom.legend(handles=tpot_lines, loc="best", fontsize=8)

    path = Path(out_dir) / ACCEPTANCE_VS_GAMMA
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    return path


def plot_acceptance_by_position(per_position: Sequence[float], out_dir: str | Path, gamma: int | None = None) -> Path:
    """Per-position acceptance rates (accepted at position i / drafts, e.g. `summarize_acceptance().per_position`).

    Position i counts a draft token only when every token before it was accepted too, so the bars fall
    along the draft; where they fall near zero, later draft tokens cost time and buy nothing.
    """
    rates = [_number(r) for r in per_position]
    if not rates:
        raise DraftsyncError(
            "no per-position acceptance rates to plot",
            "evaluate with speculation on (gamma >= 1) so drafts are counted per position",
        )
    if any(not math.isnan(r) and not 0.0 <= r <= 1.0 for r in rates):
        raise DraftsyncError(
            f"per-position acceptance rates {rates} fall outside [0, 1]",
            "divide accepted_per_position[i] by the number of drafts, not by draft tokens",
        )
    positions = list(range(1, len(rates) + 1))

    figure = _figure(max(5.0, 1.0 + 0.7 * len(rates)), 4.2)
    axis = figure.subplots()
    bars = axis.bar(positions, rates, color="tab:blue", alpha=0.85)
    axis.bar_label(bars, labels=[f"{r:.2f}" if not math.isnan(r) else "n/a" for r in rates], padding=2, fontsize=8)
    axis.set_title("Acceptance by draft position" + (f" (gamma {gamma})" if gamma is not None else ""))
    axis.set_xlabel("draft position (1 = first drafted token)")
    axis.set_ylabel("acceptance rate (accepted at position / drafts)")
    axis.set_xticks(positions)
    axis.set_ylim(0.0, 1.1)
    axis.grid(True, axis="y", alpha=0.3)

    path = Path(out_dir) / ACCEPTANCE_BY_POSITION
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=DPI)
    return path


def write_validation_plots(out_dir: str | Path, checklist: ChecklistResult) -> dict[str, Path]:
    """Both PNGs of a checklist's result into `out_dir`: the sweep with its knee, and acceptance by draft position
    at the knee; returns {"acceptance_vs_gamma": path, "acceptance_by_position": path}."""
    vs_gamma = plot_acceptance_vs_gamma(
        checklist.gamma_sweep,
        out_dir,
        knee=checklist.gamma_knee,
        plain_tpot_ms=checklist.sweep_plain_tpot_ms,
        fastest=checklist.gamma_fastest,
        knee_reason=checklist.knee_reason,
    )
    by_position = plot_acceptance_by_position(checklist.acceptance_by_position, out_dir, gamma=checklist.gamma_knee)
    return {"acceptance_vs_gamma": vs_gamma, "acceptance_by_position": by_position}
