"""Reading the spec-decode counters from a Prometheus server's HTTP API gives what /metrics gives.

`PrometheusStandIn` stands in for a Prometheus server: a real HTTP server on loopback that holds the
series of the vLLM /metrics texts it was given (each under its own target labels, as Prometheus adds `job`
and `instance` when it scrapes) and answers `/api/v1/query` with Prometheus's JSON. It evaluates only the
PromQL the client sends: `sum (NAME{l="v",...})` and `sum by (position) (NAME{...})`, and answers any other
query with Prometheus's error JSON, so a client that sent something else would fail here.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from bench.reliability_load import scaled_exposition
from draftsync.errors import DraftsyncError
from draftsync.monitors.metrics import SpecDecodeCounters, parse
from draftsync.monitors.prometheus_api import counter_queries, label_selector, query_counters
from draftsync.monitors.store import Store
from draftsync.monitors.tables import ServedPair

from tests.support.http_stub import HttpStub, StubRequest

VLLM_TEXT = (Path(__file__).parent / "vllm_metrics.txt").read_text()
QUERY = re.compile(r"^sum(?: by \((?P<by>[a-z_]+)\))? \((?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<matchers>.*)\})?\)$")
MATCHER = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


class PrometheusStandIn:
    """Stands in for a Prometheus server (see the module docstring); `targets` maps label sets to /metrics texts."""

    def __init__(self):
        self.series: list[tuple[str, dict[str, str], float]] = []
        self.queries: list[dict[str, str]] = []
        self.refuse: tuple[int, str, str] | None = None  # (HTTP status, errorType, error) to answer every query
        self.stub = HttpStub(self._answer)
        self.url = self.stub.url

    def _answer(self, request: StubRequest) -> tuple[int, str, str]:
        if request.path != "/api/v1/query":
            return 404, "text/plain", "404 page not found\n"
        self.queries.append(request.query)
        status, body = self.evaluate(request.query)
        return status, "application/json", json.dumps(body)

    def load(self, targets: dict[tuple[tuple[str, str], ...], str]) -> None:
        """Replace the stored series by those of `targets` ({(("job", "chat"),): text}), as a scrape would."""
        from prometheus_client.parser import text_string_to_metric_families

        series = []
        for target_labels, text in targets.items():
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    series.append((sample.name, {**sample.labels, **dict(target_labels)}, sample.value))
        self.series = series

    def evaluate(self, params: dict[str, str]) -> tuple[int, dict]:
        if self.refuse is not None:
            status, error_type, error = self.refuse
            return status, {"status": "error", "errorType": error_type, "error": error}
        match = QUERY.match(params.get("query", ""))
        if match is None or match["by"] not in (None, "position"):
            return 400, {
                "status": "error",
                "errorType": "bad_data",
                "error": f"the stand-in does not evaluate {params.get('query')!r}",
            }
        wanted = {
            name: re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m[1], m[1]), value)
            for name, value in MATCHER.findall(match["matchers"] or "")
        }
        groups: dict[tuple, float] = {}
        for name, labels, value in self.series:
            if name == match["name"] and all(labels.get(k) == v for k, v in wanted.items()):
                key = ((match["by"], labels.get(match["by"], "")),) if match["by"] else ()
                groups[key] = groups.get(key, 0.0) + value
        at = float(params.get("time", "0"))
        result = [{"metric": dict(key), "value": [at, repr(total)]} for key, total in sorted(groups.items())]
        return 200, {"status": "success", "data": {"resultType": "vector", "result": result}}

    def stop(self) -> None:
        self.stub.close()


@pytest.fixture
def prometheus():
    stand_in = PrometheusStandIn()
    stand_in.load(
        {
            (("job", "chat"), ("instance", "10.0.0.5:8000")): VLLM_TEXT,
            (("job", "other"), ("instance", "10.0.0.6:8000")): scaled_exposition(VLLM_TEXT, 3),
        }
    )
    yield stand_in
    stand_in.stop()


def test_the_api_gives_what_the_metrics_text_gives(prometheus):
    chat = query_counters(prometheus.url, {"job": "chat"})
    assert chat == parse(VLLM_TEXT)  # engines summed, positions kept apart, histogram sum and count
    assert chat.accepted_per_position == (1080, 840, 600) and chat.generation_tokens == 6200
    other = query_counters(prometheus.url, {"job": "other", "instance": "10.0.0.6:8000"})
    assert other == parse(scaled_exposition(VLLM_TEXT, 3)) and other.drafts == 3600
    both = query_counters(prometheus.url)  # no labels: every series Prometheus has
    assert both.drafts == chat.drafts + other.drafts
    assert both.accepted_per_position == tuple(
        a + b for a, b in zip(chat.accepted_per_position, other.accepted_per_position, strict=True)
    )
    times = {q["time"] for q in prometheus.queries[: len(counter_queries())]}
    assert len(times) == 1  # one instant for all counters of a scrape, so they agree with each other


def test_label_values_are_matched_exactly_even_with_quotes(prometheus):
    prometheus.load({(("job", 'we"ird\\job'),): VLLM_TEXT, (("job", "weird"),): scaled_exposition(VLLM_TEXT, 2)})
    assert label_selector({"job": 'we"ird\\job'}) == '{job="we\\"ird\\\\job"}'
    assert query_counters(prometheus.url, {"job": 'we"ird\\job'}) == parse(VLLM_TEXT)


def test_a_counter_reset_seen_through_prometheus_is_never_negative(prometheus, tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'monitor.db'}")
    pair = ServedPair("demo-target", 1, 1, 3)
    start = datetime(2026, 11, 2, 12, tzinfo=UTC)
    store.acceptance.record_scrape("chat", start, query_counters(prometheus.url, {"job": "chat"}), pair)
    prometheus.load({(("job", "chat"),): scaled_exposition(VLLM_TEXT, 1.5)})
    grown = store.acceptance.record_scrape(
        "chat", start + timedelta(minutes=1), query_counters(prometheus.url, {"job": "chat"}), pair
    )
    assert (grown.reset, grown.draft_tokens, grown.accepted) == (False, 1800, 1260)
    assert grown.accepted_per_position == [540, 420, 300]
    prometheus.load({(("job", "chat"),): scaled_exposition(VLLM_TEXT, 0.1)})  # the server restarted: counting from zero
    restarted = store.acceptance.record_scrape(
        "chat", start + timedelta(minutes=2), query_counters(prometheus.url, {"job": "chat"}), pair
    )
    assert restarted.reset
    assert (restarted.drafts, restarted.draft_tokens, restarted.accepted) == (120, 360, 252)
    assert restarted.accepted / restarted.draft_tokens == pytest.approx(0.7)
    store.close()


def test_no_matching_series_says_the_labels_are_likely_wrong(prometheus):
    with pytest.raises(DraftsyncError) as info:
        query_counters(prometheus.url, {"job": "chta"})
    assert prometheus.url in str(info.value) and '{job="chta"}' in str(info.value)
    assert "labels" in info.value.fix


def test_speculation_off_reads_as_zero_counters(prometheus):
    plain = "\n".join(line for line in VLLM_TEXT.splitlines() if "spec_decode" not in line) + "\n"
    prometheus.load({(("job", "chat"),): plain})
    counters = query_counters(prometheus.url, {"job": "chat"})
    assert counters == SpecDecodeCounters(generation_tokens=6200, tpot_sum=pytest.approx(74.85), tpot_count=4990)


def test_a_refused_query_names_the_server_and_the_error(prometheus):
    prometheus.refuse = (503, "unavailable", "too many concurrent queries")
    with pytest.raises(DraftsyncError) as info:
        query_counters(prometheus.url, {"job": "chat"})
    assert "unavailable: too many concurrent queries" in str(info.value) and "HTTP 503" in str(info.value)


def test_not_a_prometheus_server(prometheus):
    with pytest.raises(DraftsyncError) as info:
        query_counters(f"{prometheus.url}/metrics", {"job": "chat"})
    assert "did not answer like a Prometheus server" in str(info.value) and "HTTP 404" in str(info.value)


def test_unreachable_and_malformed_inputs():
    from draftsync.serving.process import free_port

    port = free_port()
    with pytest.raises(DraftsyncError) as info:
        query_counters(f"http://reader:s3cret@127.0.0.1:{port}", {"job": "chat"}, timeout=2)
    assert f"Prometheus at http://127.0.0.1:{port} is unreachable" in str(info.value)
    assert "s3cret" not in str(info.value)  # credentials in the URL are not shown
    with pytest.raises(DraftsyncError, match="not an http"):
        query_counters("prometheus:9090")
    with pytest.raises(DraftsyncError, match="label name"):
        query_counters("http://127.0.0.1:9", {"job-name": "chat"})


def test_the_scrape_task_can_read_from_prometheus(prometheus, tmp_path, monkeypatch):
    from draftsync.tasks import context
    from draftsync.tasks.monitoring import scrape_deployment

    monkeypatch.delenv("DRAFTSYNC_MONITOR_DB_URL", raising=False)
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path / "work"))
    context.reset()
    try:
        store = context.store()
        store.pairs.record(
            "chat",
            ServedPair(
                target_name="demo-target",
                target_version=1,
                drafter_version=1,
                gamma=3,
                drafter_name="demo-target-drafter",
            ),
            endpoint="http://127.0.0.1:9",
            state="serving",
        )
        now = datetime(2026, 11, 2, 12, tzinfo=UTC)
        first = scrape_deployment.fn("chat", now, prometheus_url=prometheus.url, prometheus_labels={"job": "chat"})
        assert (first["draft_tokens"], first["accepted"]) == (3600, 2520)  # the endpoint itself is never asked
        prometheus.load({(("job", "chat"),): scaled_exposition(VLLM_TEXT, 2)})
        second = scrape_deployment.fn(
            "chat", now + timedelta(minutes=1), prometheus_url=prometheus.url, prometheus_labels={"job": "chat"}
        )
        assert (second["draft_tokens"], second["acceptance_rate"], second["reset"]) == (3600, 0.7, False)
    finally:
        context.reset()
