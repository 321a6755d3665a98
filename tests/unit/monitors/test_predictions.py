"""A pair's first served window held to validation's prediction, and the prediction as the registry keeps it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from draftsync.monitors.predictions import check_prediction
from draftsync.monitors.rollups import HourlyRow
from draftsync.registry.tags import PredictedAcceptance, prediction_tags

START = datetime(2026, 11, 30, tzinfo=UTC)


def _hours(*counts: tuple[int, int, int, int]) -> list[HourlyRow]:
    """Hours of one deployment, oldest first: (drafter version, drafted, accepted, target version)."""
    return [
        HourlyRow(
            "chat", START + timedelta(hours=i), "llm", target, drafter, 2, draft_tokens=drafted, accepted=accepted
        )
        for i, (drafter, drafted, accepted, target) in enumerate(counts)
    ]


def test_the_first_window_is_judged_and_later_hours_do_not_count():
    rows = _hours((1, 100, 90, 1), (2, 120, 78, 1), (2, 100, 65, 1), (2, 500, 100, 1))
    check = check_prediction(rows, 1, 2, (0.70, 0.80), 200)
    assert (check.verdict, check.draft_tokens, round(check.served or 0, 3)) == ("over-predicted", 220, 0.65)
    assert check.text() == "validation over-predicted: served 0.65 over 220 drafted, predicted 0.70-0.80"
    finding = check.finding("chat")
    assert finding is not None and (finding.rule, finding.severity, finding.action) == ("prediction", "warning", "none")
    assert finding.message.startswith("drafter v2: validation over-predicted")


def test_inside_and_under_predicted():
    rows = _hours((2, 200, 150, 1), (3, 200, 190, 2))
    inside = check_prediction(rows, 1, 2, (0.70, 0.80), 200)
    assert inside.verdict == "inside" and inside.finding("chat") is None
    under = check_prediction(rows, 2, 3, (0.70, 0.80), 200)
    assert under.verdict == "under-predicted"
    finding = under.finding("chat")
    assert finding is not None and finding.severity == "info"


def test_too_few_drafted_tokens_says_how_many_more_and_finds_nothing():
    check = check_prediction(_hours((2, 60, 20, 1)), 1, 2, (0.70, 0.80), 200)
    assert (check.verdict, check.needed) == ("too few drafted tokens", 140)
    assert "60 of the 200" in check.text() and "140 more needed" in check.text()
    assert check.finding("chat") is None


def test_a_pair_without_a_prediction_says_so_and_finds_nothing():
    check = check_prediction(_hours((4, 500, 100, 1)), 1, 4, None, None)
    assert check.verdict == "no prediction" and check.finding("chat") is None
    assert check.text().startswith("no prediction")


def test_the_prediction_round_trips_through_the_version_tags():
    prediction = {
        "traffic": "held-out captured traffic",
        "requests": 24,
        "gamma": 2,
        "temperature": 0.0,
        "window_draft_tokens": 200,
        "level": 0.9,
        "mean": [0.7421, 0.7012, 0.7888],
        "p50": [0.75, 0.7, 0.8],
        "p5": [0.4, 0.2, 0.5],
    }
    tags = prediction_tags(prediction)
    assert tags["draftsync.prediction.acceptance_mean"] == "0.742 [0.701, 0.789]"
    assert tags["draftsync.prediction.basis"].startswith("held-out captured traffic (24 requests), gamma 2, T=0")
    assert PredictedAcceptance.from_tags(tags) == PredictedAcceptance(0.742, 0.701, 0.789, 200)
    assert PredictedAcceptance.from_tags({}) is None
    assert PredictedAcceptance.from_tags({**tags, "draftsync.prediction.acceptance_mean": "high"}) is None
