"""Weekly summary and staleness rules, table-driven over synthetic weeks of scrape samples."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from draftsync.monitors.metrics import SpecDecodeCounters
from draftsync.monitors.staleness import Thresholds, evaluate, suggested_gamma, worst
from draftsync.monitors.store import Store
from draftsync.monitors.tables import ServedPair
from draftsync.monitors.trends import slope_per_day, summarize

START = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
END = START + timedelta(days=7)
HOUR = timedelta(hours=1)


@dataclass
class Row:
    deployment: str
    ts: datetime
    interval_start: datetime
    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_position: list[int]
    target_name: str = "demo-target"
    target_version: int = 1
    drafter_version: int | None = 1
    gamma: int = 3
    tpot_sum: float | None = None
    tpot_count: int | None = None
    reset: bool = False


def row(ts: datetime, position_rates: tuple[float, ...], drafts: int = 100) -> Row:
    """One hourly interval where position i is accepted in position_rates[i] of the drafts."""
    per_position = [round(p * drafts) for p in position_rates]
    return Row(
        "dep",
        ts,
        ts - HOUR,
        drafts,
        drafts * len(position_rates),
        sum(per_position),
        per_position,
        gamma=len(position_rates),
    )


def week(*phases: tuple[int, tuple[float, ...]]) -> list[Row]:
    """Hourly rows for consecutive phases of (hours, position_rates), starting at START."""
    rows, hour = [], 0
    for hours, rates in phases:
        for _ in range(hours):
            hour += 1
            rows.append(row(START + hour * HOUR, rates))
    return rows


HEALTHY = (0.9, 0.8, 0.7)  # acceptance 0.80
DRIFTED = (0.75, 0.55, 0.4)  # 0.567: under mismatch, over stale
STALE = (0.6, 0.35, 0.2)  # 0.383: under stale
NOISY_UP = (0.75, 0.5, 0.45)  # 0.567: one lucky interval within a stale drop


def test_summary_numbers():
    summary = summarize(week((168, HEALTHY)), START, END)
    assert summary.deployment == "dep"
    assert summary.intervals == 168
    assert summary.acceptance_rate == pytest.approx(0.8)
    assert summary.mean_acceptance_length == pytest.approx(1 + 2.4)
    assert summary.per_position_rate == pytest.approx([0.9, 0.8, 0.7])
    assert summary.interval_p5 == pytest.approx(0.8) and summary.interval_p50 == pytest.approx(0.8)
    assert summary.slope_per_day == pytest.approx(0.0)
    assert [d for d, _ in summary.daily] == [START + timedelta(days=i) for i in range(7)]
    assert all(rate == pytest.approx(0.8) for _, rate in summary.daily)
    assert (summary.target_version, summary.drafter_version, summary.gamma) == (1, 1, 3)


def test_summary_of_a_declining_week():
    rows = week((84, HEALTHY), (84, STALE))
    summary = summarize(rows, START, END)
    assert summary.acceptance_rate == pytest.approx((0.8 + 0.38333) / 2, abs=1e-4)
    assert summary.start_rate == pytest.approx(0.8)
    assert summary.end_rate == pytest.approx(0.3833, abs=1e-3)
    assert summary.slope_per_day < -0.05
    assert summary.interval_p5 == pytest.approx(0.3833, abs=1e-3)
    assert len(summary.daily) == 7


def test_summary_skips_idle_intervals_and_counts_resets():
    rows = week((5, HEALTHY))
    rows.append(Row("dep", START + 6 * HOUR, START + 5 * HOUR, 0, 0, 0, [], reset=True))
    summary = summarize(rows, START, END)
    assert summary.intervals == 6 and len(summary.points) == 5 and summary.resets == 1


def test_empty_summary():
    summary = summarize([], START, END, deployment="idle")
    assert summary.deployment == "idle" and summary.acceptance_rate is None and summary.daily == []
    assert [f.rule for f in evaluate(summary, 1, 1)] == ["no_data"]


def test_slope_per_day():
    line = [(START + timedelta(days=d), 0.9 - 0.1 * d) for d in range(5)]
    assert slope_per_day(line) == pytest.approx(-0.1)
    assert slope_per_day(line[:1]) is None


@pytest.mark.parametrize(
    "case, rows, served, trained_for, expected",
    [
        ("healthy", week((168, HEALTHY)), 1, 1, []),
        ("mismatch", week((160, HEALTHY), (8, DRIFTED)), 1, 1, [("mismatch", "warning", "fallback")]),
        ("mismatch all week", week((168, DRIFTED)), 1, 1, [("mismatch", "warning", "fallback")]),
        ("stale", week((120, HEALTHY), (48, STALE)), 1, 1, [("stale", "critical", "fallback+retrain")]),
        ("one bad hour is a blip", week((167, HEALTHY), (1, STALE)), 1, 1, []),
        (
            "two bad hours: not sustained yet",
            week((166, HEALTHY), (2, STALE)),
            1,
            1,
            [("mismatch", "warning", "fallback")],
        ),
        (
            "a noisy drop: one interval above 0.50, the window below",
            week((160, HEALTHY), (7, STALE), (1, NOISY_UP)),
            1,
            1,
            [("stale", "critical", "fallback+retrain")],
        ),
        ("lineage mismatch", week((168, HEALTHY)), 2, 1, [("lineage", "critical", "retrain")]),
        ("gamma too large", week((168, (0.98, 0.97, 0.96, 0.05))), 1, 1, [("gamma", "info", "none")]),
        ("no drafter served", week((168, HEALTHY)), 2, None, []),
        ("too little traffic", [row(START + HOUR, HEALTHY, drafts=20)], 1, 1, [("no_data", "info", "none")]),
    ],
)
def test_staleness_rules(case, rows, served, trained_for, expected):
    findings = evaluate(summarize(rows, START, END), served, trained_for, Thresholds())
    assert [(f.rule, f.severity, f.action) for f in findings] == expected, case
    for finding in findings:
        assert finding.deployment == "dep" and "dep" in finding.message
        assert finding.key == f"dep:{finding.rule}"


def test_messages_carry_the_numbers():
    stale = evaluate(summarize(week((120, HEALTHY), (48, STALE)), START, END), 1, 1)[0]
    assert "0.38" in stale.message and "0.50" in stale.message and "0.80 -> 0.38" in stale.message
    assert stale.value == pytest.approx(0.3833, abs=1e-3)
    lineage = evaluate(summarize(week((168, HEALTHY)), START, END), 3, 1)[0]
    assert "version 1" in lineage.message and "version 3" in lineage.message and lineage.value == 2
    gamma = evaluate(summarize(week((168, (0.98, 0.97, 0.96, 0.05))), START, END), 1, 1)[0]
    assert "suggested gamma 3" in gamma.message


def test_stale_and_lineage_together_and_worst():
    findings = evaluate(summarize(week((120, HEALTHY), (48, STALE)), START, END), 2, 1)
    assert {f.rule for f in findings} == {"stale", "lineage"}
    assert worst(findings).severity == "critical"
    assert worst([]) is None


def test_thresholds_are_configurable():
    rows = week((168, DRIFTED))
    assert evaluate(summarize(rows, START, END), 1, 1, Thresholds(mismatch=0.5, stale=0.4)) == []
    stricter = evaluate(summarize(rows, START, END), 1, 1, Thresholds(mismatch=0.7, stale=0.6))
    assert [f.rule for f in stricter] == ["stale"]


def test_suggested_gamma():
    assert suggested_gamma([0.9, 0.5, 0.08, 0.3], 0.1) == 2
    assert suggested_gamma([0.05], 0.1) == 1


def test_summary_over_stored_rows(tmp_path):
    """The same rules read the store's rows (a fake clock that runs an hour per scrape)."""
    store = Store(f"sqlite:///{tmp_path / 'm.db'}")
    pair = ServedPair("demo-target", 1, 1, 3)
    totals = [0, 0, 0, [0, 0, 0]]
    store.acceptance.record_scrape("dep", START, SpecDecodeCounters(), pair)
    for hour, rates in enumerate([HEALTHY] * 100 + [STALE] * 68, start=1):
        totals[0] += 100
        totals[1] += 300
        per_position = [round(p * 100) for p in rates]
        totals[2] += sum(per_position)
        totals[3] = [a + b for a, b in zip(totals[3], per_position, strict=True)]
        counters = SpecDecodeCounters(totals[0], totals[1], totals[2], tuple(totals[3]))
        store.acceptance.record_scrape("dep", START + hour * HOUR, counters, pair)
    summary = summarize(store.acceptance.samples("dep", START, END), START, END)
    assert summary.intervals == 168
    assert [f.rule for f in evaluate(summary, 1, 1)] == ["stale"]
    store.close()


def _hourly_week(rates, start=datetime(2026, 11, 2, tzinfo=UTC)):
    """A week of hourly samples with the given acceptance rates (100 draft tokens each)."""
    from types import SimpleNamespace

    return [
        SimpleNamespace(
            deployment="d",
            ts=start + timedelta(hours=i + 1),
            interval_start=start + timedelta(hours=i),
            target_name="t",
            target_version=1,
            drafter_version=1,
            gamma=2,
            drafts=50,
            draft_tokens=100,
            accepted=int(round(100 * r)),
            accepted_per_position=[int(round(50 * r))] * 2,
            reset=False,
            generation_tokens=None,
            tpot_sum=None,
            tpot_count=None,
        )
        for i, r in enumerate(rates)
    ]


def test_a_steady_decline_above_the_thresholds_is_a_trend_finding_and_noise_is_not():
    from draftsync.monitors.staleness import Thresholds, evaluate
    from draftsync.monitors.trends import summarize

    start = datetime(2026, 11, 2, tzinfo=UTC)
    declining = [0.85 - 0.15 * i / 167 + (0.01 if i % 2 else -0.01) for i in range(168)]  # 0.85 -> 0.70
    flat = [0.78 + (0.05 if i % 2 else -0.05) for i in range(168)]
    for rates, expected in ((declining, True), (flat, False)):
        summary = summarize(_hourly_week(rates, start), start, start + timedelta(days=7), deployment="d")
        rules = {f.rule for f in evaluate(summary, 1, 1, Thresholds())}
        assert ("trend" in rules) is expected, rules
        assert "stale" not in rules and "mismatch" not in rules


def test_acceptance_under_its_own_baseline_is_flagged_before_the_global_thresholds():
    from draftsync.monitors.staleness import Baseline, Thresholds, evaluate
    from draftsync.monitors.trends import summarize

    first = datetime(2026, 10, 26, tzinfo=UTC)
    steady = [0.80 + (0.01 if i % 2 else -0.01) for i in range(168)]
    baseline = Baseline.from_summary(
        summarize(_hourly_week(steady, first), first, first + timedelta(days=7), deployment="d")
    )
    assert baseline.acceptance_rate == pytest.approx(0.80, abs=0.01) and baseline.std < 0.02
    now_start = datetime(2026, 11, 23, tzinfo=UTC)
    lower = summarize(_hourly_week([0.68] * 168, now_start), now_start, now_start + timedelta(days=7), deployment="d")
    rules = {f.rule: f for f in evaluate(lower, 1, 1, Thresholds(), baseline=baseline)}
    assert "baseline" in rules and "mismatch" not in rules  # 0.68 is above 0.60, but far under 0.80 +- 0.01
    assert rules["baseline"].value == pytest.approx(0.68, abs=0.01)
    same = summarize(_hourly_week(steady, now_start), now_start, now_start + timedelta(days=7), deployment="d")
    assert "baseline" not in {f.rule for f in evaluate(same, 1, 1, Thresholds(), baseline=baseline)}
