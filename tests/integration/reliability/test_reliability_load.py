"""Load: one scrape cycle over 200 endpoints serving vLLM's Prometheus text, and the webhook receiver at 200
requests/s for 10 s with valid and invalid deliveries mixed. Each answer and each stored sample is checked;
timings are printed, never asserted (bench/reliability_load.py measures them on a quiet machine). The webhook
test runs first, while the Prefect harness is idle: the scrape's 400 task runs keep it busy for a while after.

The scrape runs the real `acceptance-scrape` flow on a Prefect test harness (the flow is what bounds its
concurrency), the receiver runs as `draftsync webhooks serve` in its own process, and both use the monitor store
and sync ledger on the session's Postgres.
"""

from __future__ import annotations

import secrets
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from bench.reliability_load import (
    OTHER_MODEL,
    TARGET_NAME,
    TARGET_VERSION,
    MetricsFleet,
    load_summary,
    open_loop,
    outcome_problems,
    plan_deliveries,
    receiver_process,
    sample_problems,
    version_created,
    warm_up,
    watching_task_runs,
)

pytestmark = pytest.mark.slow

ENDPOINTS = 200
RATE = 200
SECONDS = 10


@pytest.fixture(scope="module")
def prefect_api() -> str:
    """A Prefect test harness for this module's flow runs; its API URL also takes the receiver's events."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


@pytest.fixture
def monitor_on_postgres(workdir, postgres_url, monkeypatch) -> str:
    """The work dir's monitor store on a fresh Postgres database."""
    from draftsync.tasks import context

    monkeypatch.setenv("DRAFTSYNC_MONITOR_DB_URL", postgres_url)
    context.reset()
    yield postgres_url
    context.store().close()


@pytest.mark.system  # make test-system
def test_the_webhook_receiver_at_200_requests_a_second_answers_every_request_as_it_should(
    prefect_api, postgres_url, tmp_path
):
    """2000 requests sent on schedule: no 5xx, no connection error, every answer the one its kind gets; afterwards
    one ledger job, accepted deliveries still refused as replays and forged ones never remembered."""
    import httpx
    from draftsync.monitors.store import Store
    from draftsync.monitors.sync_jobs import WebhookDelivery
    from draftsync.receiver.app import WEBHOOK_PATH
    from draftsync.registry.webhooks import sign_delivery
    from sqlalchemy import func, select

    secret = secrets.token_hex(32)
    with receiver_process(tmp_path, secret, postgres_url, prefect_api) as receiver:
        url = receiver.url + WEBHOOK_PATH
        assert warm_up(url, secret)["action"] == "sync requested"
        deliveries = plan_deliveries(secret, RATE * SECONDS, int(time.time()))
        outcomes = open_loop(url, deliveries, RATE)
        summary = load_summary(outcomes, RATE)
        print(f"webhook load: {summary}")
        assert summary["errors"] == 0
        assert outcome_problems(deliveries, outcomes) == []
        assert summary["by_status"] == {"200": 1000, "400": 250, "401": 500, "409": 250}

        accepted = [d for d in deliveries if d.kind.startswith("valid-")]
        forged = [d for d in deliveries if d.kind == "forged"]
        with httpx.Client(timeout=30) as client:
            for delivery in accepted[::100]:
                again = client.post(url, content=delivery.body, headers=delivery.headers)
                assert (again.status_code, again.json()["reason"]) == (409, "replayed")
            body = version_created(OTHER_MODEL, 2)
            for delivery in forged[::100]:  # a forged delivery burnt no id: the genuine one with it goes through
                genuine = sign_delivery(secret, delivery.headers["X-MLflow-Delivery-Id"], int(time.time()), body)
                assert client.post(url, content=body, headers=genuine).status_code == 200
            fresh = sign_delivery(secret, str(uuid.uuid4()), int(time.time()), body)
            assert client.post(url, content=body, headers=fresh).status_code == 200

    store = Store(postgres_url)
    try:
        jobs = store.ledger.jobs()
        assert [(j.target_name, j.target_version, j.source) for j in jobs] == [(TARGET_NAME, TARGET_VERSION, "webhook")]
        with store.engine.connect() as connection:
            remembered = connection.execute(select(func.count()).select_from(WebhookDelivery)).scalar_one()
        assert remembered == 1 + len(accepted) + len(forged[::100]) + 1  # warm-up, load, genuine after forged, fresh
    finally:
        store.close()


def test_one_scrape_cycle_over_200_endpoints_books_every_pair_once_with_the_exact_deltas(
    prefect_api, monitor_on_postgres
):
    """Two flow runs: each endpoint is asked once per cycle, no task fails or retries, and each pair holds one
    sample per cycle: the counters it started with, then exactly their growth."""
    from draftsync.flows.scrape import scrape
    from draftsync.tasks import context

    store = context.store()
    first = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    second = first + timedelta(minutes=1)
    names = sorted(MetricsFleet.deployment(index) for index in range(ENDPOINTS))
    with MetricsFleet(ENDPOINTS) as fleet:
        fleet.register(store)
        with watching_task_runs() as trouble:
            for at in (first, second):
                started = time.perf_counter()
                result = scrape(at)
                print(f"scrape cycle over {ENDPOINTS} endpoints: {time.perf_counter() - started:.2f} s")
                assert sorted(r["deployment"] for r in result["deployments"]) == names
                assert all("draft_tokens" in r and not r["reset"] for r in result["deployments"])
                fleet.grow()
        assert trouble.lines == []  # no scrape failed, not even once before a retry
        assert fleet.metrics_gets == [2] * ENDPOINTS
        assert not fleet.other_requests
        assert sample_problems(store, fleet, first, second) == []
