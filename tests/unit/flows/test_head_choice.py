"""Which of a target's own MTP heads a sync serves: the shipped one unless it is stale (a failed gate, or under the
pair serving now), then the refreshed one only where it passes and scores above the shipped one."""

from __future__ import annotations

import pytest
from draftsync.flows.sync import HeadVerdict, choose_head, stale_head


def _measured(shipped: float, passed: bool = True, before: float | None = None) -> HeadVerdict:
    return HeadVerdict(shipped_version=1, shipped_acceptance=shipped, shipped_passed=passed, served_before=before)


def _refreshed(measured: HeadVerdict, acceptance: float, passed: bool = True) -> HeadVerdict:
    from dataclasses import replace

    return replace(measured, refreshed_version=2, refreshed_acceptance=acceptance, refreshed_passed=passed)


def test_a_shipped_head_that_passes_and_holds_the_served_acceptance_serves_as_shipped():
    for before in (None, 0.60, 0.70):
        measured = _measured(0.70, before=before)
        assert stale_head(measured, []) is None
        verdict = choose_head(measured, None)
        assert verdict.promoted == "shipped" and "passed every gate at acceptance 0.700" in verdict.reason


def test_a_shipped_head_is_stale_when_it_fails_a_gate_or_scores_under_the_pair_serving_now():
    assert stale_head(_measured(0.40, passed=False), ["acceptance"]) == "it failed acceptance"
    under = stale_head(_measured(0.48, before=0.77), [])
    assert under == "acceptance 0.480 under the pair serving before (0.770)"


def test_a_refreshed_head_above_the_shipped_one_serves():
    measured = _measured(0.48, before=0.77)
    verdict = choose_head(_refreshed(measured, 0.70), stale_head(measured, []))
    assert verdict.promoted == "refreshed"
    assert verdict.reason == (
        "refreshed, as the shipped head was stale (acceptance 0.480 under the pair serving before (0.770)): "
        "refreshed 0.700 against shipped 0.480"
    )


@pytest.mark.parametrize(("acceptance", "passed", "why"), [
    (0.45, True, "its acceptance is not above the shipped head's"),
    (0.48, True, "its acceptance is not above the shipped head's"),
    (0.90, False, "it failed its gates"),
])  # fmt: skip
def test_a_refreshed_head_under_the_shipped_one_is_not_promoted_and_says_why(acceptance, passed, why):
    measured = _measured(0.48, before=0.77)
    verdict = choose_head(_refreshed(measured, acceptance, passed), stale_head(measured, []))
    assert verdict.promoted == "shipped"  # it passed its gates: the better of the two that pass serves
    assert f"a refreshed head under the shipped one is not promoted: {why}" in verdict.reason


def test_neither_head_serves_when_both_fail():
    measured = _measured(0.30, passed=False)
    verdict = choose_head(_refreshed(measured, 0.35, passed=False), stale_head(measured, ["p50"]))
    assert verdict.promoted is None and verdict.reason.startswith(
        "neither head serves: the shipped one was stale (it failed p50); "
    )
