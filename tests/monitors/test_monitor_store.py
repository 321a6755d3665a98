"""The monitor store on SQLite and on a real Postgres: scrapes, deltas, watermarks, pairs, alerts, outbox."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from draftsync.errors import DraftsyncError
from draftsync.monitors.metrics import SpecDecodeCounters
from draftsync.monitors.store import ServedPair, Store

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
    assert store.record_scrape("dep", T0, SpecDecodeCounters(100, 300, 210, (90, 70, 50)), PAIR) is None
    first = store.record_scrape("dep", T0 + timedelta(minutes=1), SpecDecodeCounters(130, 390, 270, (117, 90, 63)), PAIR)
    second = store.record_scrape("dep", T0 + timedelta(minutes=2), SpecDecodeCounters(130, 390, 270, (117, 90, 63)), PAIR)
    assert (first.drafts, first.draft_tokens, first.accepted) == (30, 90, 60)
    assert first.accepted_per_position == [27, 20, 13]
    assert first.interval_start == T0 and first.reset is False
    assert (second.drafts, second.draft_tokens, second.accepted) == (0, 0, 0)

    rows = store.samples("dep", T0, T0 + timedelta(minutes=2))
    assert [r.ts for r in rows] == [T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]
    assert all(r.ts.tzinfo is not None for r in rows)  # aware UTC on SQLite too
    assert rows[0].accepted_per_position == [27, 20, 13]
    assert (rows[0].target_name, rows[0].target_version, rows[0].drafter_version, rows[0].gamma) == ("demo-target", 1, 1, 3)
    # the window is (since, until]: a sample stamped at `since` belongs to the previous window
    assert [r.ts for r in store.samples("dep", T0 + timedelta(minutes=1), T0 + timedelta(hours=1))] == [
        T0 + timedelta(minutes=2)
    ]
    assert store.samples("other", T0, T0 + timedelta(hours=1)) == []
    assert store.deployments_with_samples(T0, T0 + timedelta(hours=1)) == ["dep"]


def test_counter_reset_is_recorded(store):
    store.record_scrape("dep", T0, SpecDecodeCounters(1000, 3000, 2000, (900, 700, 400)), PAIR)
    sample = store.record_scrape("dep", T0 + timedelta(minutes=1), SpecDecodeCounters(10, 30, 12, (6, 4, 2)), PAIR)
    assert sample.reset is True
    assert (sample.drafts, sample.draft_tokens, sample.accepted) == (10, 30, 12)
    after = store.record_scrape("dep", T0 + timedelta(minutes=2), SpecDecodeCounters(20, 60, 30, (12, 10, 8)), PAIR)
    assert after.reset is False and after.accepted == 18  # the baseline moved to the post-restart counters


def test_count_first_and_clock_must_move_forward(store):
    first = store.record_scrape("fresh", T0, SpecDecodeCounters(5, 15, 9, (4, 3, 2)), PAIR, count_first=True)
    assert first.accepted == 9 and first.interval_start == first.ts == T0
    with pytest.raises(DraftsyncError, match="not after the last one"):
        store.record_scrape("fresh", T0, SpecDecodeCounters(6, 18, 10, (4, 3, 3)), PAIR)


def test_tpot_and_generation_tokens_are_kept(store):
    store.record_scrape("dep", T0, SpecDecodeCounters(1, 3, 2, (1, 1, 0), 10, 0.5, 10), PAIR)
    sample = store.record_scrape("dep", T0 + timedelta(minutes=1), SpecDecodeCounters(2, 6, 4, (2, 1, 1), 30, 1.25, 30), PAIR)
    assert (sample.generation_tokens, sample.tpot_count) == (20, 20)
    assert sample.tpot_sum == pytest.approx(0.75)


def test_watermark(store):
    assert store.get_watermark("demo-target") is None
    store.set_watermark("demo-target", 1, T0)
    store.set_watermark("demo-target", 2, T0 + timedelta(hours=1))
    store.set_watermark("other", 7, T0)
    assert store.get_watermark("demo-target") == 2
    assert store.get_watermark("other") == 7


def test_serving_pair_is_replaced_not_duplicated(store):
    store.set_serving_pair("dep", target_name="demo-target", target_version=1, drafter_name="demo-target-drafter",
                           drafter_version=1, gamma=3, endpoint="http://127.0.0.1:9000", state="serving", now=T0)
    store.set_serving_pair("dep", target_name="demo-target", target_version=2, drafter_name=None,
                           drafter_version=None, gamma=0, endpoint="http://127.0.0.1:9001", state="fallback",
                           now=T0 + timedelta(days=1))
    store.set_serving_pair("b-dep", target_name="t", target_version=4, drafter_name="d", drafter_version=3,
                           gamma=2, endpoint="http://127.0.0.1:9002", state="serving", now=T0)
    pair = store.serving_pair("dep")
    assert (pair.target_version, pair.drafter_version, pair.state, pair.gamma) == (2, None, "fallback", 0)
    assert pair.updated_at == T0 + timedelta(days=1)
    assert [p.deployment for p in store.serving_pairs()] == ["b-dep", "dep"]
    assert store.serving_pair("missing") is None
    with pytest.raises(DraftsyncError, match="state"):
        store.set_serving_pair("dep", target_name="t", target_version=1, drafter_name=None, drafter_version=None,
                               gamma=0, endpoint="x", state="broken", now=T0)


def test_alert_dedupe_for_a_week_unless_worse(store):
    key = "dep:stale"
    assert store.should_alert(key, T0, 0.45, severity="critical")
    store.record_alert(key, deployment="dep", rule="stale", severity="critical", value=0.45, sent_at=T0)
    assert not store.should_alert(key, T0 + timedelta(days=3), 0.44, severity="critical")  # same finding
    assert store.should_alert(key, T0 + timedelta(days=3), 0.30, severity="critical")  # got worse
    assert store.should_alert(key, T0 + timedelta(days=7), 0.45, severity="critical")  # a week later
    assert store.should_alert("dep:mismatch", T0 + timedelta(days=1), 0.58)  # another rule is another key

    store.record_alert("dep:mismatch", deployment="dep", rule="mismatch", severity="warning", value=0.58, sent_at=T0)
    assert store.should_alert("dep:mismatch", T0 + timedelta(days=1), 0.58, severity="critical")  # escalated

    store.record_alert("dep:lineage", deployment="dep", rule="lineage", severity="critical", value=1, sent_at=T0)
    assert not store.should_alert("dep:lineage", T0 + timedelta(days=1), 1, severity="critical", higher_is_worse=True)
    assert store.should_alert("dep:lineage", T0 + timedelta(days=1), 2, severity="critical", higher_is_worse=True)
    assert [a.rule for a in store.alerts("dep")] == ["stale", "mismatch", "lineage"]


def test_outbox_claim_is_exclusive(store):
    entry = store.add_outbox(subject="s", recipients=["a@x", "b@x"], eml_path="/tmp/x.eml", created_at=T0)
    assert entry.status == "pending" and entry.attempts == 0
    assert store.claim_outbox(entry.id, 0)
    assert not store.claim_outbox(entry.id, 0)  # a second sender that read the same state loses
    store.mark_outbox(entry.id, "sent", sent_at=T0)
    assert not store.claim_outbox(entry.id, 1)  # sent messages are never claimed again
    assert [e.id for e in store.outbox("sent")] == [entry.id]
    assert store.outbox("pending") == []


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
    from draftsync.monitors.store import ServedPair, Store

    store = Store(f"sqlite:///{tmp_path / 'm.db'}")
    pair = ServedPair("t", 1, 1, 2)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    store.record_scrape("d", t0, SpecDecodeCounters(10, 20, 12, (8, 4)), pair)
    store.forget_scrape_baseline("d")
    sample = store.record_scrape("d", t0 + timedelta(minutes=1), SpecDecodeCounters(30, 60, 40, (20, 20)), pair, count_first=True)
    assert (sample.drafts, sample.draft_tokens, sample.accepted) == (30, 60, 40)
    assert not sample.reset
