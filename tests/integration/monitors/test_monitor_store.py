"""The monitor store on SQLite and on a real Postgres: scrapes, deltas, watermarks, pairs, alerts, outbox."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from draftsync.errors import DraftsyncError
from draftsync.monitors.metrics import SpecDecodeCounters
from draftsync.monitors.rollups import hourly_rows
from draftsync.monitors.store import Store
from draftsync.monitors.tables import Alert, ServedPair
from sqlalchemy import select

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
PAIR = ServedPair(target_name="demo-target", target_version=1, drafter_version=1, gamma=3)


@pytest.fixture(params=["sqlite", "postgres"])
def store(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'monitor.db'}"
    else:
        url = request.getfixturevalue("postgres_url")
    opened = Store(url)
    yield opened
    opened.close()


def test_first_scrape_sets_the_baseline_then_deltas_are_stored(store):
    assert store.acceptance.record_scrape("dep", T0, SpecDecodeCounters(100, 300, 210, (90, 70, 50)), PAIR) is None
    first = store.acceptance.record_scrape(
        "dep", T0 + timedelta(minutes=1), SpecDecodeCounters(130, 390, 270, (117, 90, 63)), PAIR
    )
    second = store.acceptance.record_scrape(
        "dep", T0 + timedelta(minutes=2), SpecDecodeCounters(130, 390, 270, (117, 90, 63)), PAIR
    )
    assert (first.drafts, first.draft_tokens, first.accepted) == (30, 90, 60)
    assert first.accepted_per_position == [27, 20, 13]
    assert first.interval_start == T0 and first.reset is False
    assert (second.drafts, second.draft_tokens, second.accepted) == (0, 0, 0)

    rows = store.acceptance.samples("dep", T0, T0 + timedelta(minutes=2))
    assert [r.ts for r in rows] == [T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]
    assert all(r.ts.tzinfo is not None for r in rows)  # aware UTC on SQLite too
    assert rows[0].accepted_per_position == [27, 20, 13]
    assert (rows[0].target_name, rows[0].target_version, rows[0].drafter_version, rows[0].gamma) == (
        "demo-target",
        1,
        1,
        3,
    )
    # the window is (since, until]: a sample stamped at `since` belongs to the previous window
    assert [r.ts for r in store.acceptance.samples("dep", T0 + timedelta(minutes=1), T0 + timedelta(hours=1))] == [
        T0 + timedelta(minutes=2)
    ]
    assert store.acceptance.samples("other", T0, T0 + timedelta(hours=1)) == []


def test_counter_reset_is_recorded(store):
    store.acceptance.record_scrape("dep", T0, SpecDecodeCounters(1000, 3000, 2000, (900, 700, 400)), PAIR)
    sample = store.acceptance.record_scrape(
        "dep", T0 + timedelta(minutes=1), SpecDecodeCounters(10, 30, 12, (6, 4, 2)), PAIR
    )
    assert sample.reset is True
    assert (sample.drafts, sample.draft_tokens, sample.accepted) == (10, 30, 12)
    after = store.acceptance.record_scrape(
        "dep", T0 + timedelta(minutes=2), SpecDecodeCounters(20, 60, 30, (12, 10, 8)), PAIR
    )
    assert after.reset is False and after.accepted == 18  # the baseline moved to the post-restart counters


def test_count_first_and_clock_must_move_forward(store):
    first = store.acceptance.record_scrape("fresh", T0, SpecDecodeCounters(5, 15, 9, (4, 3, 2)), PAIR, count_first=True)
    assert first.accepted == 9 and first.interval_start == first.ts == T0
    with pytest.raises(DraftsyncError, match="not after the last one"):
        store.acceptance.record_scrape("fresh", T0, SpecDecodeCounters(6, 18, 10, (4, 3, 3)), PAIR)


def test_tpot_and_generation_tokens_are_kept(store):
    store.acceptance.record_scrape("dep", T0, SpecDecodeCounters(1, 3, 2, (1, 1, 0), 10, 0.5, 10), PAIR)
    sample = store.acceptance.record_scrape(
        "dep", T0 + timedelta(minutes=1), SpecDecodeCounters(2, 6, 4, (2, 1, 1), 30, 1.25, 30), PAIR
    )
    assert (sample.generation_tokens, sample.tpot_count) == (20, 20)
    assert sample.tpot_sum == pytest.approx(0.75)


def test_watermark(store):
    assert store.watermarks.get("demo-target") is None
    store.watermarks.set("demo-target", 1, T0)
    store.watermarks.set("demo-target", 2, T0 + timedelta(hours=1))
    store.watermarks.set("other", 7, T0)
    assert store.watermarks.get("demo-target") == 2
    assert store.watermarks.get("other") == 7


def test_serving_pair_is_replaced_not_duplicated(store):
    store.pairs.record(
        "dep",
        ServedPair(
            target_name="demo-target", target_version=1, drafter_version=1, gamma=3, drafter_name="demo-target-drafter"
        ),
        endpoint="http://127.0.0.1:9000",
        state="serving",
        now=T0,
    )
    store.pairs.record(
        "dep",
        ServedPair(target_name="demo-target", target_version=2, drafter_version=None, gamma=0, drafter_name=None),
        endpoint="http://127.0.0.1:9001",
        state="fallback",
        now=T0 + timedelta(days=1),
    )
    store.pairs.record(
        "b-dep",
        ServedPair(target_name="t", target_version=4, drafter_version=3, gamma=2, drafter_name="d"),
        endpoint="http://127.0.0.1:9002",
        state="serving",
        now=T0,
    )
    pair = store.pairs.get("dep")
    assert (pair.target_version, pair.drafter_version, pair.state, pair.gamma) == (2, None, "fallback", 0)
    assert pair.updated_at == T0 + timedelta(days=1)
    assert [p.deployment for p in store.pairs.all()] == ["b-dep", "dep"]
    assert store.pairs.get("missing") is None
    with pytest.raises(DraftsyncError, match="state"):
        store.pairs.record(
            "dep",
            ServedPair(target_name="t", target_version=1, drafter_version=None, gamma=0, drafter_name=None),
            endpoint="x",
            state="broken",
            now=T0,
        )


def test_a_pair_state_changes_alone_and_keeps_the_date_the_pair_started(store):
    store.pairs.record(
        "dep",
        ServedPair(target_name="t", target_version=1, drafter_version=2, gamma=3, drafter_name="d"),
        endpoint="http://127.0.0.1:9000",
        state="serving",
        now=T0,
    )
    store.pairs.set_state("dep", "stopped")
    pair = store.pairs.get("dep")
    assert (pair.state, pair.updated_at, pair.drafter_version, pair.gamma) == ("stopped", T0, 2, 3)
    assert store.pairs.set_state("missing", "stopped") is None
    with pytest.raises(DraftsyncError, match="'serving', 'fallback', 'stale', 'stopped'"):
        store.pairs.set_state("dep", "paused")
    assert store.pairs.get("dep").state == "stopped"


def test_a_pair_is_recorded_from_a_served_pair_and_again_from_its_row(store):
    """A rollout records the pair it chose; the weekly review re-records the stored row with a new state."""
    served = ServedPair("t", 4, 3, 2, drafter_name="t-drafter", method="eagle3", schedule=[[1, 2]])
    store.pairs.record("dep", served, endpoint="http://127.0.0.1:9000", state="serving", now=T0)
    first = store.pairs.get("dep")
    store.pairs.record("dep", first, endpoint=first.endpoint, state="stale", now=T0 + timedelta(days=1))
    pair = store.pairs.get("dep")
    assert (pair.target_name, pair.target_version, pair.drafter_name, pair.drafter_version) == ("t", 4, "t-drafter", 3)
    assert (pair.gamma, pair.endpoint, pair.state) == (2, "http://127.0.0.1:9000", "stale")
    assert pair.updated_at == T0 + timedelta(days=1)
    assert [p.deployment for p in store.pairs.all()] == ["dep"]


def test_a_findings_alert_is_recorded_under_its_key(store):
    from draftsync.monitors.staleness import Finding

    finding = Finding("dep", "stale", "critical", 0.45, "acceptance fell", "fallback+retrain")
    row = store.alerts.record_finding(finding, sent_at=T0)
    assert (row.key, row.rule, row.severity, row.value) == ("dep:stale", "stale", "critical", 0.45)
    assert (row.deployment, row.outbox_id) == ("dep", None)
    assert not store.alerts.should_send(finding.key, T0 + timedelta(days=1), 0.45, severity="critical")


def test_alert_dedupe_for_a_week_unless_worse(store):
    key = "dep:stale"
    assert store.alerts.should_send(key, T0, 0.45, severity="critical")
    store.alerts.record(key, deployment="dep", rule="stale", severity="critical", value=0.45, sent_at=T0)
    assert not store.alerts.should_send(key, T0 + timedelta(days=3), 0.44, severity="critical")  # same finding
    assert store.alerts.should_send(key, T0 + timedelta(days=3), 0.30, severity="critical")  # got worse
    assert store.alerts.should_send(key, T0 + timedelta(days=7), 0.45, severity="critical")  # a week later
    assert store.alerts.should_send("dep:mismatch", T0 + timedelta(days=1), 0.58)  # another rule is another key

    store.alerts.record("dep:mismatch", deployment="dep", rule="mismatch", severity="warning", value=0.58, sent_at=T0)
    assert store.alerts.should_send("dep:mismatch", T0 + timedelta(days=1), 0.58, severity="critical")  # escalated

    store.alerts.record("dep:lineage", deployment="dep", rule="lineage", severity="critical", value=1, sent_at=T0)
    assert not store.alerts.should_send(
        "dep:lineage", T0 + timedelta(days=1), 1, severity="critical", higher_is_worse=True
    )
    assert store.alerts.should_send("dep:lineage", T0 + timedelta(days=1), 2, severity="critical", higher_is_worse=True)
    with store.transaction() as session:
        rules = session.scalars(select(Alert.rule).where(Alert.deployment == "dep").order_by(Alert.sent_at, Alert.id))
        assert list(rules) == ["stale", "mismatch", "lineage"]


def test_outbox_claim_is_exclusive(store):
    entry = store.outbox.add(subject="s", recipients=["a@x", "b@x"], eml_path="/tmp/x.eml", message=b"", created_at=T0)
    assert entry.status == "pending" and entry.attempts == 0
    assert store.outbox.claim(entry.id, 0)
    assert not store.outbox.claim(entry.id, 0)  # a second sender that read the same state loses
    store.outbox.mark(entry.id, "sent", sent_at=T0)
    assert not store.outbox.claim(entry.id, 1)  # sent messages are never claimed again
    assert [e.id for e in store.outbox.entries("sent")] == [entry.id]
    assert store.outbox.entries("pending") == []


def test_unreachable_database_is_a_clear_error():
    from draftsync.serving.process import free_port

    with pytest.raises(DraftsyncError) as info:
        Store(f"postgresql+psycopg://user:s3cret@127.0.0.1:{free_port()}/monitor")
    assert "s3cret" not in str(info.value)
    assert "DRAFTSYNC_MONITOR_DB_URL" in info.value.fix


def test_a_new_instance_is_not_diffed_against_the_one_it_replaced(tmp_path):
    """After a rollout the old server's counters must not be subtracted from the new one's."""
    from datetime import UTC, datetime, timedelta

    from draftsync.monitors.metrics import SpecDecodeCounters
    from draftsync.monitors.store import Store
    from draftsync.monitors.tables import ServedPair

    store = Store(f"sqlite:///{tmp_path / 'm.db'}")
    pair = ServedPair("t", 1, 1, 2)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    store.acceptance.record_scrape("d", t0, SpecDecodeCounters(10, 20, 12, (8, 4)), pair)
    store.acceptance.forget_baseline("d")
    sample = store.acceptance.record_scrape(
        "d", t0 + timedelta(minutes=1), SpecDecodeCounters(30, 60, 40, (20, 20)), pair, count_first=True
    )
    assert (sample.drafts, sample.draft_tokens, sample.accepted) == (30, 60, 40)
    assert not sample.reset


# --- hourly rollups -----------------------------------------------------------------------------
def _totals(rows) -> tuple:
    """What a window sums to, from samples or hourly rows alike."""
    width = max((len(r.accepted_per_position) for r in rows), default=0)
    per_position = [sum((r.accepted_per_position + [0] * width)[i] for r in rows) for i in range(width)]
    return (
        sum(r.drafts for r in rows),
        sum(r.draft_tokens for r in rows),
        sum(r.accepted for r in rows),
        per_position,
        sum(r.tpot_count or 0 for r in rows),
        sum(1 if getattr(r, "reset", False) else 0 for r in rows) + sum(getattr(r, "resets", 0) for r in rows),
    )


def _traffic(store, deployment: str, start: datetime, minutes: range, *, fallback_from: int | None = None) -> None:
    """Scrapes every `minutes` step with growing counters; speculation off from minute `fallback_from` on."""
    drafts = tokens = accepted = generated = 0
    per_position = [0, 0, 0]
    tpot = 0.0
    for minute in minutes:
        off = fallback_from is not None and minute >= fallback_from
        if not off:
            drafts, tokens = drafts + 10 + minute % 7, tokens + 3 * (10 + minute % 7)
            gained = [9, 6 + minute % 3, 2 + minute % 5]
            per_position = [a + b for a, b in zip(per_position, gained, strict=True)]
            accepted += sum(gained)
        generated += 50
        tpot += 0.8
        pair = ServedPair("demo-target", 1, None, 0) if off else PAIR
        store.acceptance.record_scrape(
            deployment,
            start + timedelta(minutes=minute),
            SpecDecodeCounters(drafts, tokens, accepted, tuple(per_position), generated, tpot, generated),
            pair,
        )


def test_record_scrape_keeps_hourly_rollups(store):
    _traffic(store, "dep", T0, range(0, 181, 7), fallback_from=120)
    # a restart in the third hour: counters start again from zero
    store.acceptance.record_scrape(
        "dep", T0 + timedelta(hours=3), SpecDecodeCounters(1, 3, 2, (1, 1, 0), 5, 0.1, 5), PAIR
    )

    samples = store.acceptance.samples("dep", T0, T0 + timedelta(hours=4))
    rows = store.acceptance.hourly("dep", T0, T0 + timedelta(hours=4))
    assert rows == hourly_rows(samples)
    assert _totals(rows) == _totals(samples)
    # one row per hour and pair; the speculation-off pair gets its own row with drafter_version None
    assert [(r.hour - T0, r.drafter_version, r.gamma) for r in rows] == [
        (timedelta(hours=0), 1, 3),
        (timedelta(hours=1), 1, 3),
        (timedelta(hours=2), None, 0),
        (timedelta(hours=2), 1, 3),
    ]
    # the scrape at exactly 03:00 ends an interval inside (02:00, 03:00]: it counts in the 02:00 row
    assert rows[-1].last_ts == T0 + timedelta(hours=3) and rows[-1].resets == 1
    assert [r.intervals for r in rows] == [8, 9, 8, 1]


def _rounded(rows) -> list:
    """Hourly rows with TPOT sums to 9 digits: SQL and Python add the floats in different orders."""
    from dataclasses import replace

    return [replace(r, tpot_sum=None if r.tpot_sum is None else float(f"{r.tpot_sum:.9g}")) for r in rows]


def test_rollup_window_is_exact_for_any_window(store):
    _traffic(store, "a", T0, range(0, 300, 3), fallback_from=170)
    _traffic(store, "b", T0 + timedelta(minutes=95), range(0, 60, 5))
    for minute in range(0, 200, 4):  # no TPOT or generation counters; a restart at minute 120
        n = minute if minute < 120 else minute - 119
        store.acceptance.record_scrape(
            "c", T0 + timedelta(minutes=minute), SpecDecodeCounters(n, 2 * n, n, (n // 2, n - n // 2)), PAIR
        )
    windows = [
        (T0, T0 + timedelta(hours=5)),  # whole hours
        (T0 + timedelta(minutes=17), T0 + timedelta(hours=3, minutes=41)),  # both edges inside an hour
        (T0 + timedelta(minutes=100), T0 + timedelta(minutes=130)),  # inside one hour
        (T0 + timedelta(hours=1, minutes=33), T0 + timedelta(hours=2)),  # ends on the hour
        (T0 + timedelta(hours=2, minutes=40), T0 + timedelta(hours=9)),  # b has nothing here
    ]
    for since, until in windows:
        window = store.acceptance.rollup_window(since, until)
        expected = {name: store.acceptance.samples(name, since, until) for name in ("a", "b", "c")}
        expected = {name: rows for name, rows in expected.items() if rows}
        assert sorted(window) == sorted(expected), (since, until)
        for name, rows in window.items():
            assert _totals(rows) == _totals(expected[name]), (name, since, until)
            assert _rounded(rows) == _rounded(hourly_rows(expected[name])), (name, since, until)
            assert all(since - timedelta(hours=1) < r.hour < until for r in rows)
        assert store.acceptance.rollup_window(since, until, ["b"]).get("b", []) == window.get("b", [])
    assert store.acceptance.rollup_window(T0, T0) == {}


def test_the_week_summary_from_rollups_equals_the_one_from_samples(store):
    """Hourly scrapes: every interval is its own hour, so the two summaries must agree field for field."""
    from draftsync.monitors.trends import summarize, summarize_hourly

    start, end = T0, T0 + timedelta(days=7)
    drafts = tokens = accepted = 0
    per_position = [0, 0, 0]
    store.acceptance.record_scrape("dep", start, SpecDecodeCounters(), PAIR)
    for hour in range(1, 169):
        rate = 0.8 - 0.3 * hour / 168
        drafts, tokens = drafts + 20, tokens + 60
        gained = [round(20 * rate + 2), round(20 * rate), round(20 * rate - 2)]
        per_position = [a + b for a, b in zip(per_position, gained, strict=True)]
        accepted += sum(gained)
        store.acceptance.record_scrape(
            "dep",
            start + timedelta(hours=hour),
            SpecDecodeCounters(drafts, tokens, accepted, tuple(per_position)),
            PAIR,
        )
    from_samples = summarize(store.acceptance.samples("dep", start, end), start, end, deployment="dep")
    from_rollups = summarize_hourly(store.acceptance.hourly("dep", start, end), start, end, deployment="dep")
    assert from_rollups == from_samples
    assert from_rollups.acceptance_rate == pytest.approx(0.65, abs=0.01) and len(from_rollups.daily) == 7


def test_minute_scrapes_summarized_from_rollups_keep_the_sums(store):
    from draftsync.monitors.trends import summarize, summarize_hourly

    _traffic(store, "dep", T0, range(0, 241, 1), fallback_from=200)
    start, end = T0, T0 + timedelta(hours=4)
    from_samples = summarize(store.acceptance.samples("dep", start, end), start, end, bucket=timedelta(hours=1))
    from_rollups = summarize_hourly(store.acceptance.hourly("dep", start, end), start, end, bucket=timedelta(hours=1))
    for name in (
        "intervals",
        "drafts",
        "draft_tokens",
        "accepted",
        "acceptance_rate",
        "mean_acceptance_length",
        "per_position_rate",
        "daily",
        "resets",
        "target_name",
        "drafter_version",
        "gamma",
    ):
        assert getattr(from_rollups, name) == getattr(from_samples, name), name
    assert from_rollups.drafter_version is None  # the last hour was served with speculation off
    assert len(from_samples.points) == 199 and len(from_rollups.points) == 4  # points are per hour


def test_captured_requests_are_booked_once_at_the_monitors_clock_to_the_pair_serving_then(store):
    """Per-request acceptance (what per-domain and per-pair percentiles are taken from) and the capture watermark
    move in one transaction; a request that drafted nothing has no rate and is not booked."""
    t0 = datetime(2026, 12, 1, 12, tzinfo=UTC)
    rows = [
        {"id": 1, "domain": "prose", "draft_tokens": 30, "accepted_tokens": 3},
        {"id": 2, "domain": None, "draft_tokens": 20, "accepted_tokens": 18},
        {"id": 3, "domain": "code", "draft_tokens": 0, "accepted_tokens": 0},
    ]
    assert store.acceptance.captured_watermark("chat") == 0
    assert store.acceptance.book_requests("chat", t0, PAIR, rows, last_row=3) == 2
    assert store.acceptance.captured_watermark("chat") == 3
    later = ServedPair(target_name="demo-target", target_version=1, drafter_version=2, gamma=2)
    store.acceptance.book_requests(
        "chat", t0 + timedelta(hours=1), later, [{"domain": "prose", "draft_tokens": 10, "accepted_tokens": 9}], 4
    )
    booked = store.acceptance.booked_requests("chat", t0 - timedelta(hours=1), t0 + timedelta(hours=1))
    assert [(r.domain, r.draft_tokens, r.accepted, r.drafter_version) for r in booked] == [
        ("prose", 30, 3, 1),
        (None, 20, 18, 1),
        ("prose", 10, 9, 2),
    ]
    assert store.acceptance.booked_requests("chat", t0, t0 + timedelta(hours=1))[0].ts == t0 + timedelta(
        hours=1
    )  # (since, until]
    assert store.acceptance.booked_requests("other", t0 - timedelta(days=1), t0 + timedelta(days=1)) == []
    assert store.acceptance.captured_watermark("chat") == 4
    # rows past the retention go when the deployment books again; another deployment's stay
    store.acceptance.book_requests("other", t0, PAIR, [{"domain": "code", "draft_tokens": 5, "accepted_tokens": 5}], 1)
    later_still = t0 + timedelta(days=36)
    store.acceptance.book_requests(
        "chat", later_still, later, [{"domain": "prose", "draft_tokens": 4, "accepted_tokens": 4}], 5
    )
    everything = (t0 - timedelta(days=1), later_still)
    assert [r.ts for r in store.acceptance.booked_requests("chat", *everything)] == [later_still]
    assert len(store.acceptance.booked_requests("other", *everything)) == 1
