"""The sync ledger on SQLite and on Postgres: duplicate triggers make one sync, crashes and retrains re-open it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from draftsync.monitors.store import Store
from draftsync.monitors.sync_jobs import MAX_ATTEMPTS

T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'monitor.db'}"
    else:
        url = request.getfixturevalue("postgres_server").create_database()
    store = Store(url)
    yield store.ledger
    store.close()


def test_twenty_concurrent_requests_for_one_version_let_exactly_one_caller_start_it(ledger):
    barrier = threading.Barrier(20)
    winners: list[int] = []

    def ask(i: int) -> None:
        barrier.wait()
        if ledger.request("tiny", 3, "eagle3", source=f"caller-{i}", reason="new version", now=T0):
            winners.append(i)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(winners) == 1
    jobs = ledger.jobs("tiny")
    assert [(j.target_version, j.method, j.status, j.source) for j in jobs] == [
        (3, "eagle3", "requested", f"caller-{winners[0]}")
    ]
    # Another version or another method is another job.
    assert ledger.request("tiny", 4, "eagle3", source="poll", reason="new version", now=T0)
    assert ledger.request("tiny", 3, "medusa", source="poll", reason="new version", now=T0)


def test_concurrent_claims_give_the_job_to_one_run_and_a_finished_job_stays_done(ledger):
    ledger.request("tiny", 1, "eagle3", source="webhook", reason="new version", now=T0)
    barrier = threading.Barrier(8)
    outcomes: list[str] = []

    def claim(i: int) -> None:
        barrier.wait()
        outcomes.append(ledger.claim("tiny", 1, "eagle3", run_id=f"run-{i}", now=T0).outcome)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["claimed"] + ["running"] * 7
    job = ledger.get("tiny", 1, "eagle3")
    assert job.status == "running" and job.attempts == 1 and job.run_id.startswith("run-")
    ledger.finish(job.id, "succeeded", drafter_version=5, now=T0 + timedelta(minutes=9))
    assert not ledger.request("tiny", 1, "eagle3", source="poll", reason="again", now=T0)
    again = ledger.claim("tiny", 1, "eagle3", run_id="late-duplicate", now=T0)
    assert again.outcome == "done" and again.job.drafter_version == 5 and again.job.run_id == job.run_id


def test_a_crashed_run_is_taken_over_only_by_name_and_failures_retry_a_bounded_number_of_times(ledger):
    first = ledger.claim("tiny", 2, "eagle3", run_id="run-a", now=T0)
    assert first.outcome == "claimed" and first.job.source == "direct"
    # Run a died without finishing (kill -9): a second run sees it running until told run a is dead.
    assert ledger.claim("tiny", 2, "eagle3", run_id="run-b", now=T0).outcome == "running"
    assert ledger.claim("tiny", 2, "eagle3", run_id="run-b", takeover_from="run-x", now=T0).outcome == "running"
    taken = ledger.claim("tiny", 2, "eagle3", run_id="run-b", takeover_from="run-a", now=T0)
    assert taken.outcome == "claimed" and taken.job.run_id == "run-b" and taken.job.attempts == 2
    ledger.finish(taken.job.id, "failed", detail="RuntimeError: out of memory", now=T0)
    # A failed job is re-opened by the next request, until it has failed MAX_ATTEMPTS times.
    assert ledger.request("tiny", 2, "eagle3", source="poll", reason="reconcile", now=T0)
    third = ledger.claim("tiny", 2, "eagle3", run_id="run-c", now=T0)
    assert third.outcome == "claimed" and third.job.attempts == MAX_ATTEMPTS
    ledger.finish(third.job.id, "failed", detail="again", now=T0)
    assert not ledger.request("tiny", 2, "eagle3", source="poll", reason="reconcile", now=T0)
    assert ledger.claim("tiny", 2, "eagle3", run_id="run-d", now=T0).outcome == "exhausted"
    # A retrain re-opens it as the next generation with a fresh attempt budget.
    assert ledger.request("tiny", 2, "eagle3", source="stale", reason="acceptance 0.45", retrain=True, now=T0)
    job = ledger.get("tiny", 2, "eagle3")
    assert (job.status, job.generation, job.attempts, job.source) == ("requested", 1, 0, "stale")


def test_a_retrain_of_a_finished_job_is_asked_for_once_however_many_findings_arrive(ledger):
    claim = ledger.claim("tiny", 1, "eagle3", run_id="run-a", now=T0)
    ledger.finish(claim.job.id, "succeeded", drafter_version=1, now=T0)
    answers = [
        ledger.request("tiny", 1, "eagle3", source="stale", reason="stale", retrain=True, now=T0) for _ in range(5)
    ]
    assert answers == [True, False, False, False, False]
    assert ledger.get("tiny", 1, "eagle3").generation == 1


def test_overdue_requests_are_found_for_the_reconciler_and_their_clock_restarts(ledger):
    ledger.request("tiny", 1, "eagle3", source="webhook", reason="new", now=T0)
    ledger.request("tiny", 2, "eagle3", source="webhook", reason="new", now=T0 + timedelta(minutes=8))
    overdue = ledger.overdue(timedelta(minutes=10), now=T0 + timedelta(minutes=12))
    assert [j.target_version for j in overdue] == [1]
    ledger.touch_request(overdue[0].id, now=T0 + timedelta(minutes=12))
    assert ledger.overdue(timedelta(minutes=10), now=T0 + timedelta(minutes=13)) == []


def test_a_webhook_delivery_id_is_accepted_once_and_forgotten_after_a_day(ledger):
    assert ledger.remember_delivery("d-1", now=T0)
    assert not ledger.remember_delivery("d-1", now=T0 + timedelta(seconds=5))
    assert ledger.remember_delivery("d-2", now=T0 + timedelta(days=2))  # prunes d-1
    assert ledger.remember_delivery("d-1", now=T0 + timedelta(days=2))


def test_a_dead_runs_job_is_given_back_until_it_has_had_max_attempts(ledger):
    """The reconciler's release: `requested` again while attempts remain, `failed` after MAX_ATTEMPTS, and never
    a job some other run has taken over meanwhile."""
    assert ledger.claim("tiny", 7, "eagle3", run_id="run-a", now=T0).outcome == "claimed"
    assert [j.target_version for j in ledger.running()] == [7]
    assert ledger.release(ledger.get("tiny", 7, "eagle3").id, "someone-else", now=T0) is None
    job = ledger.get("tiny", 7, "eagle3")
    assert (job.status, job.run_id) == ("running", "run-a")

    later = T0 + timedelta(minutes=5)
    assert ledger.release(job.id, "run-a", now=later) == "requested"
    job = ledger.get("tiny", 7, "eagle3")
    assert (job.status, job.requested_at, job.attempts) == ("requested", later, 1)
    assert "run run-a died" in job.detail and ledger.running() == []

    for attempt in range(2, MAX_ATTEMPTS + 1):
        assert ledger.claim("tiny", 7, "eagle3", run_id=f"run-{attempt}", now=later).outcome == "claimed"
        status = ledger.release(job.id, f"run-{attempt}", now=later)
        assert status == ("requested" if attempt < MAX_ATTEMPTS else "failed")
    job = ledger.get("tiny", 7, "eagle3")
    assert (job.status, job.attempts) == ("failed", MAX_ATTEMPTS)
    assert f"gave up after {MAX_ATTEMPTS} attempts" in job.detail
    assert ledger.claim("tiny", 7, "eagle3", run_id="run-late", now=later).outcome == "exhausted"
