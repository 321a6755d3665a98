"""Serving held to what validation predicted: a pair's first window of served acceptance against its interval.

Validation records, with each drafter version, the interval it expects a served window of N drafted tokens to fall
in (`draftsync.prediction.*` tags). The first N drafted tokens a pair serves are the window that tests the gate: later
windows can drift with the traffic, which the staleness rules judge. A window outside the interval is a finding: a gate
that over-predicts lets drafters through that serving then calls stale, and a team learns how far to trust it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from draftsync.monitors.rollups import HourlyRow
from draftsync.monitors.staleness import Finding

Verdict = Literal["inside", "over-predicted", "under-predicted", "no prediction", "too few drafted tokens"]


@dataclass(frozen=True)
class PredictionCheck:
    """One pair's served acceptance over its first window against validation's interval for it."""

    target_version: int
    drafter_version: int
    predicted: tuple[float, float] | None  # (low, high); None: the version carries no prediction
    served: float | None  # pooled over the window (or over all it served, while the window is not full)
    draft_tokens: int  # drafted in the window
    window_draft_tokens: int | None
    verdict: Verdict

    @property
    def needed(self) -> int:
        """Drafted tokens still to serve before the window is full."""
        return max(0, (self.window_draft_tokens or 0) - self.draft_tokens)

    def text(self) -> str:
        served = "-" if self.served is None else f"{self.served:.2f}"
        if self.predicted is None:
            return (
                f"no prediction (drafter v{self.drafter_version} carries none: registered by hand, validated before "
                f"predictions, or gone from the registry): served {served}"
            )
        low, high = self.predicted
        if self.verdict == "too few drafted tokens":
            return (
                f"too few drafted tokens to judge: {self.draft_tokens} of the {self.window_draft_tokens} its "
                f"prediction ({low:.2f}-{high:.2f}) is for, {self.needed} more needed"
            )
        return (
            f"validation {self.verdict}: served {served} over {self.draft_tokens} drafted, "
            f"predicted {low:.2f}-{high:.2f}"
        )

    def finding(self, deployment: str) -> Finding | None:
        """A finding when the window fell outside the interval: a warning when validation over-predicted (its gate let
        through less than it promised), info when it under-predicted."""
        if self.verdict not in ("over-predicted", "under-predicted") or self.served is None:
            return None
        return Finding(
            deployment=deployment,
            rule="prediction",
            severity="warning" if self.verdict == "over-predicted" else "info",
            value=self.served,
            message=f"drafter v{self.drafter_version}: {self.text()}",
            action="none",
        )


def check_prediction(
    rows: Sequence[HourlyRow],
    target_version: int,
    drafter_version: int,
    predicted: tuple[float, float] | None,
    window_draft_tokens: int | None,
) -> PredictionCheck:
    """The pair's first window in `rows` (a deployment's hours, oldest first): its hours from the first, until they
    drafted `window_draft_tokens`, pooled; judged against `predicted` once the window is full."""
    draft_tokens = accepted = 0
    for row in rows:
        if (row.target_version, row.drafter_version) != (target_version, drafter_version):
            continue
        draft_tokens += row.draft_tokens
        accepted += row.accepted
        if window_draft_tokens is not None and draft_tokens >= window_draft_tokens:
            break
    served = accepted / draft_tokens if draft_tokens else None
    verdict: Verdict
    if predicted is None or window_draft_tokens is None:
        verdict = "no prediction"
    elif served is None or draft_tokens < window_draft_tokens:
        verdict = "too few drafted tokens"
    elif served < predicted[0]:
        verdict = "over-predicted"
    elif served > predicted[1]:
        verdict = "under-predicted"
    else:
        verdict = "inside"
    return PredictionCheck(
        target_version, drafter_version, predicted, served, draft_tokens, window_draft_tokens, verdict
    )
