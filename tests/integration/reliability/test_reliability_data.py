"""Bad data on the monitoring and training sides: metrics text no server could have sent is refused with the
endpoint named and stores nothing, so the next good scrape books exactly the traffic since the last good one;
a dataset with no usable sequence fails the data checks before a drafter trains on it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from draftsync.errors import DraftsyncError
from draftsync.monitors.tables import ServedPair

from tests.support.http_stub import PROMETHEUS_TEXT, HttpStub

COUNTERS = (
    "# TYPE vllm:spec_decode_num_drafts counter\n"
    'vllm:spec_decode_num_drafts_total{{model_name="m",engine="0"}} {drafts}\n'
    "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
    'vllm:spec_decode_num_draft_tokens_total{{model_name="m",engine="0"}} {draft_tokens}\n'
    "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
    'vllm:spec_decode_num_accepted_tokens_total{{model_name="m",engine="0"}} {accepted}\n'
    "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n"
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",engine="0",position="0"}} {first}\n'
    'vllm:spec_decode_num_accepted_tokens_per_pos_total{{model_name="m",engine="0",position="1"}} {second}\n'
)


def counters_text(drafts: int, accepted: int, first: int) -> str:
    return COUNTERS.format(
        drafts=drafts, draft_tokens=2 * drafts, accepted=accepted, first=first, second=accepted - first
    )


GOOD_BEFORE = counters_text(100, 150, 90)
GOOD_AFTER = counters_text(160, 230, 135)
# What a broken exporter, a proxy or the wrong port can answer, and what the parser must say about each.
BAD_TEXTS = {
    "an HTML error page": ("<html><body>502 Bad Gateway</body></html>", "did not return Prometheus text"),
    "an infinite counter": (GOOD_AFTER.replace(" 160\n", " +Inf\n"), "has the value inf"),
    "a NaN counter": (GOOD_AFTER.replace(" 230\n", " NaN\n"), "has the value nan"),
    "a negative counter": (GOOD_AFTER.replace(" 320\n", " -320\n"), "has the value -320"),
    "a counter beyond 2**53": (GOOD_AFTER.replace(" 160\n", " 1e30\n"), "has the value 1e+30"),
    "a huge position label": (GOOD_AFTER.replace('position="1"', 'position="999999999"'), "position='999999999'"),
    "a truncated body": (GOOD_AFTER[: GOOD_AFTER.index("{") + 12], "did not return Prometheus text"),
}


class MetricsEndpoint:
    """A real HTTP server on loopback (the shared stub) whose /metrics answers whatever text the test sets."""

    def __init__(self):
        self.text = ""
        self._stub = HttpStub(lambda request: (200, PROMETHEUS_TEXT, self.text))
        self.url = self._stub.url

    def close(self) -> None:
        self._stub.close()


@pytest.fixture
def endpoint():
    served = MetricsEndpoint()
    yield served
    served.close()


def test_a_scrape_of_bad_metrics_text_names_the_endpoint_and_loses_nothing(workdir, endpoint):
    """Every bad answer between two good scrapes is refused; the good scrape after them books the exact delta."""
    from draftsync.tasks import context
    from draftsync.tasks.monitoring import scrape_deployment

    store = context.store()
    store.pairs.record(
        "chat",
        ServedPair(target_name="t", target_version=1, drafter_version=1, gamma=2, drafter_name="t-drafter"),
        endpoint=endpoint.url,
        state="serving",
    )
    start = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    hour = (start - timedelta(minutes=1), start + timedelta(hours=1))
    endpoint.text = GOOD_BEFORE
    first = scrape_deployment.fn("chat", start)  # the server started at zero: its first counters are booked
    assert (first["draft_tokens"], first["accepted"]) == (200, 150)

    for minute, (label, (text, complaint)) in enumerate(BAD_TEXTS.items(), start=1):
        endpoint.text = text
        with pytest.raises(DraftsyncError) as error:
            scrape_deployment.fn("chat", start + timedelta(minutes=minute))
        assert f"metrics endpoint {endpoint.url}/metrics" in error.value.what, label
        assert complaint in error.value.what, label
        assert error.value.fix, label
    assert len(store.acceptance.samples("chat", *hour)) == 1

    endpoint.text = GOOD_AFTER
    result = scrape_deployment.fn("chat", start + timedelta(minutes=30))
    assert result == {
        "deployment": "chat",
        "draft_tokens": 120,
        "accepted": 80,
        "acceptance_rate": pytest.approx(80 / 120),
        "reset": False,
    }
    booked, sample = store.acceptance.samples("chat", *hour)
    assert (booked.drafts, booked.draft_tokens, booked.accepted) == (100, 200, 150)
    assert (sample.drafts, sample.draft_tokens, sample.accepted) == (60, 120, 80)
    assert list(sample.accepted_per_position) == [45, 35]
    assert sample.interval_start == start  # the interval spans the refused scrapes: nothing fell between


def test_counts_up_to_two_to_the_53_are_still_accepted():
    """The bound refuses garbage, not a long-lived busy server."""
    from draftsync.monitors.metrics import parse

    big = 2**53
    counters = parse(counters_text(big // 2, big // 4, big // 8), source="metrics endpoint http://10.0.0.5/metrics")
    assert (counters.drafts, counters.draft_tokens) == (big // 2, big)


def test_a_scrape_books_the_requests_its_router_captured_once_at_the_monitors_clock(workdir, endpoint):
    """The per-request acceptance a deployment's capture holds goes into the monitor store with the scrape that
    read it (never the prompt), to the pair serving then; the next scrape books only what came after."""
    import json

    from draftsync.serving.deployment import ServingDeployment, TrafficCaptureSettings
    from draftsync.serving.traffic_capture import TrafficCapture
    from draftsync.tasks import context
    from draftsync.tasks.monitoring import scrape_deployment
    from draftsync.tasks.serving import capture_config

    store = context.store()
    store.pairs.record(
        "chat", ServedPair("t", 1, 1, 2, drafter_name="t-drafter"), endpoint=endpoint.url, state="serving"
    )
    spec = ServingDeployment(name="chat", target_name="t", capture=TrafficCaptureSettings(rate=1.0))
    config = capture_config(spec)
    capture = TrafficCapture(config, seed=0)

    def served(count: int, accepted: int) -> None:
        answer = {"metrics": {"speculative_decoding": {"num_draft_tokens": 10, "num_accepted_draft_tokens": accepted}}}
        for index in range(count):
            body = json.dumps({"model": "chat", "prompt": f"secret prompt {index}"}).encode()
            capture.offer("/v1/completions", {"X-Draftsync-Domain": "prose"}, body, 200, json.dumps(answer).encode())
        capture.flush()

    start = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    endpoint.text = GOOD_BEFORE
    served(3, 2)
    assert scrape_deployment.fn("chat", start, capture=config)["requests_booked"] == 3
    new_drafter = ServedPair("t", 1, 2, 2, drafter_name="t-drafter")
    store.pairs.record("chat", new_drafter, endpoint=endpoint.url, state="serving")  # a new drafter serves
    served(2, 9)
    endpoint.text = GOOD_AFTER
    assert scrape_deployment.fn("chat", start + timedelta(minutes=1), capture=config)["requests_booked"] == 2
    booked = store.acceptance.booked_requests("chat", start - timedelta(hours=1), start + timedelta(hours=1))
    assert [(r.ts, r.drafter_version, r.domain, r.accepted) for r in booked] == [
        *[(start, 1, "prose", 2)] * 3,
        *[(start + timedelta(minutes=1), 2, "prose", 9)] * 2,
    ]
    assert "requests_booked" not in scrape_deployment.fn("chat", start + timedelta(minutes=2))  # no capture given


def test_a_dataset_without_a_usable_sequence_fails_the_data_checks(tmp_path):
    """No sample, or only samples too short to train on: the build writes an empty dataset, the checks refuse it."""
    import torch
    from draftsync.speculative.data.samples import Sample
    from draftsync.speculative.data.shard_writer import build_shards
    from draftsync.validation.data_checks import run_data_checks
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
    )
    model = LlamaForCausalLM(config).eval()
    unusable = [Sample("code", [], []), Sample("code", [5], [1])]
    for name, samples in {"no-samples": [], "unusable-samples": unusable}.items():
        out = tmp_path / name
        manifest = build_shards(model, samples, out, (0, 1, 2), shard_tokens=60, batch_size=4)
        assert manifest["num_sequences"] == 0
        with pytest.raises(DraftsyncError) as error:
            run_data_checks(out, config, {"code": 1.0})
        assert f"data checks failed on {out}" in error.value.what
        assert "[at least one sequence] observed 0, expected >= 1" in error.value.what
        assert "rebuild the dataset" in error.value.fix
        assert error.value.report.sequences == 0
