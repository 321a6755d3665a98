"""Parsing vLLM's spec-decode counters, deltas across restarts, and scrape errors."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from draftsync.errors import DraftsyncError
from draftsync.monitors.metrics import SpecDecodeCounters, delta, parse, scrape, scrape_counters

VLLM_TEXT = (Path(__file__).parent / "vllm_metrics.txt").read_text()


def test_parse_sums_engines_and_keeps_positions():
    counters = parse(VLLM_TEXT, source="http://127.0.0.1:8000/metrics")
    assert counters.drafts == 1200
    assert counters.draft_tokens == 3600
    assert counters.accepted == 2520
    assert counters.accepted_per_position == (1080, 840, 600)
    assert counters.generation_tokens == 6200  # the `_created` gauge is not added in
    assert counters.tpot_count == 4990
    assert counters.tpot_sum == pytest.approx(74.85)


def test_untyped_series_keep_their_total_suffix_and_still_parse():
    text = (
        'vllm:spec_decode_num_drafts_total{model_name="m"} 10\n'
        'vllm:spec_decode_num_draft_tokens_total{model_name="m"} 30\n'
        'vllm:spec_decode_num_accepted_tokens_total{model_name="m"} 12\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="m",position="1"} 4\n'
    )
    counters = parse(text)
    assert (counters.drafts, counters.draft_tokens, counters.accepted) == (10, 30, 12)
    assert counters.accepted_per_position == (0, 4)  # a missing position reads as zero
    assert counters.generation_tokens is None and counters.tpot_sum is None


def test_missing_series_read_as_zero():
    counters = parse("# HELP up whatever\n# TYPE up gauge\nup 1\n")
    assert counters == SpecDecodeCounters()


@pytest.mark.parametrize("garbage", ["<html><body>Not Found</body></html>", "Internal Server Error", "{}"])
def test_garbage_names_the_endpoint(garbage):
    with pytest.raises(DraftsyncError) as info:
        parse(garbage, source="metrics endpoint http://10.0.0.5:8000/metrics")
    assert "http://10.0.0.5:8000/metrics" in str(info.value)
    assert "/metrics" in info.value.fix


def test_delta_between_scrapes():
    before = SpecDecodeCounters(100, 300, 200, (90, 70, 40), generation_tokens=500, tpot_sum=1.0, tpot_count=50)
    after = SpecDecodeCounters(150, 450, 290, (135, 100, 55), generation_tokens=700, tpot_sum=1.5, tpot_count=70)
    change, reset = delta(before, after)
    assert not reset
    assert change == SpecDecodeCounters(50, 150, 90, (45, 30, 15), generation_tokens=200, tpot_sum=0.5, tpot_count=20)


def test_counter_going_down_is_a_restart_and_the_delta_is_the_new_count():
    before = SpecDecodeCounters(1000, 3000, 2000, (900, 700, 400))
    after = SpecDecodeCounters(20, 60, 15, (10, 4, 1))
    change, reset = delta(before, after)
    assert reset
    assert change == after
    assert min(change.drafts, change.draft_tokens, change.accepted, *change.accepted_per_position) >= 0


def test_restart_seen_in_a_per_position_counter_alone():
    before = SpecDecodeCounters(10, 30, 20, (9, 7, 4))
    after = SpecDecodeCounters(12, 36, 21, (10, 7, 3))
    assert delta(before, after)[1]


def test_gamma_growing_between_scrapes_pads_positions():
    change, reset = delta(SpecDecodeCounters(10, 20, 10, (6, 4)), SpecDecodeCounters(20, 50, 25, (12, 8, 5)))
    assert not reset
    assert change.accepted_per_position == (6, 4, 5)


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's hook name
        body, status = (VLLM_TEXT, 200) if self.path == "/metrics" else ("Not Found", 404)
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_scrape_over_http(metrics_server):
    assert scrape_counters(f"{metrics_server}/metrics").draft_tokens == 3600


def test_scrape_wrong_path_and_unreachable_endpoint(metrics_server):
    with pytest.raises(DraftsyncError, match="HTTP 404"):
        scrape(f"{metrics_server}/nope")
    from draftsync.serving.process import free_port

    with pytest.raises(DraftsyncError, match="unreachable"):
        scrape(f"http://127.0.0.1:{free_port()}/metrics", timeout=2)
