"""Traffic capture at the router: a bounded, redacted sample of the served prompts with each request's acceptance,
which never slows or fails a request (a real router process in front of a real HTTP upstream)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from draftsync.serving.process import ServerProcess, free_port
from draftsync.serving.router import CAPTURE_PATH, LIVE_PATH, router_command, write_token_file
from draftsync.serving.traffic_capture import CaptureConfig, TrafficCapture, captured_rows

from tests.support.http_stub import HttpStub

ANSWER = {
    "choices": [{"text": " the answer"}],
    "metrics": {"speculative_decoding": {"num_draft_tokens": 30, "num_accepted_draft_tokens": 24}},
}


def _capture(tmp_path, **settings) -> TrafficCapture:
    config = CaptureConfig(path=tmp_path / "traffic" / "chat.db", deployment="chat", **{"rate": 1.0, **settings})
    return TrafficCapture(config, seed=0)


def _offer(capture, prompt="def f():", headers=None, path="/v1/completions", body=None, answer=ANSWER):
    request = body if body is not None else {"model": "m", "prompt": prompt, "max_tokens": 8}
    capture.offer(path, headers or {}, json.dumps(request).encode(), 200, json.dumps(answer).encode())


def test_a_sampled_request_keeps_its_prompt_domain_and_acceptance_but_not_its_response(tmp_path):
    capture = _capture(tmp_path)
    _offer(capture, "2 + 2 =", headers={"X-Draftsync-Domain": "math"})
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": {"domain": "support"}}
    _offer(capture, path="/v1/chat/completions", body=chat)
    _offer(capture, path="/v1/models")  # not a completion: never captured
    capture.flush()
    first, second = captured_rows(capture.config.path)
    assert (first["prompt"], first["domain"], first["draft_tokens"], first["accepted_tokens"]) == (
        "2 + 2 =",
        "math",
        30,
        24,
    )
    assert first["response"] is None  # responses are kept only when the deployment asks
    assert (second["prompt"], second["domain"]) == (chat["messages"], "support")
    assert capture.stats()["captured"] == 2 and capture.stats()["seen"] == 2


def test_each_request_keeps_the_length_its_client_asked_for_and_what_it_got(tmp_path):
    """A retrain's validation replays held-out requests at the length served: the capture keeps max_tokens (or a
    chat's max_completion_tokens) and the answer's completion tokens; a file written before these columns gets them."""
    import sqlite3

    path = tmp_path / "traffic" / "chat.db"
    path.parent.mkdir(parents=True)
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE captured_requests (id INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, deployment TEXT NOT "
        "NULL, domain TEXT, path TEXT NOT NULL, prompt TEXT NOT NULL, response TEXT, draft_tokens INTEGER, "
        "accepted_tokens INTEGER)"
    )
    old.execute(
        "INSERT INTO captured_requests (at, deployment, path, prompt) VALUES (?, 'chat', '/v1/completions', ?)",
        (time.time(), json.dumps("kept from before")),
    )
    old.commit()
    old.close()
    capture = _capture(tmp_path)
    _offer(capture, "2 + 2 =", answer={**ANSWER, "usage": {"completion_tokens": 6}})
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 24}
    _offer(capture, path="/v1/chat/completions", body=chat, answer={**ANSWER, "usage": "not a mapping"})
    _offer(capture, body={"model": "m", "prompt": "no limit", "max_tokens": True})
    capture.flush()
    rows = captured_rows(path)
    assert [(r["prompt"], r["max_tokens"], r["output_tokens"]) for r in rows] == [
        ("kept from before", None, None),
        ("2 + 2 =", 8, 6),
        (chat["messages"], 24, None),
        ("no limit", None, None),
    ]
    assert capture.stats()["captured"] == 3


def test_responses_are_kept_only_when_asked_and_the_rate_samples(tmp_path):
    kept = _capture(tmp_path / "a", keep_responses=True)
    _offer(kept)
    kept.flush()
    assert captured_rows(kept.config.path)[0]["response"] == " the answer"
    sampled = _capture(tmp_path / "b", rate=0.25)
    for _ in range(400):
        _offer(sampled)
    sampled.flush()
    assert 60 < len(captured_rows(sampled.config.path)) < 140 and sampled.stats()["seen"] == 400


def test_redaction_runs_before_anything_is_stored_and_a_failing_hook_drops_the_sample(tmp_path):
    masking = _capture(tmp_path / "a", redact="tests.integration.serving.capture_hooks:mask_digits")
    _offer(masking, "card 4111 1111")
    skipping = _capture(tmp_path / "b", redact="tests.integration.serving.capture_hooks:skip_secrets")
    _offer(skipping, "my secret is x")
    _offer(skipping, "nothing to hide")
    failing = _capture(tmp_path / "c", redact="tests.integration.serving.capture_hooks:explode")
    _offer(failing, "anything")
    for capture in (masking, skipping, failing):
        capture.flush()
    assert [r["prompt"] for r in captured_rows(masking.config.path)] == ["card #### ####"]
    assert [r["prompt"] for r in captured_rows(skipping.config.path)] == ["nothing to hide"]
    assert skipping.stats()["redacted_away"] == 1
    assert captured_rows(failing.config.path) == [] and failing.stats()["dropped_redaction"] == 1


@pytest.mark.parametrize(
    ("label", "stored", "counted"),
    [
        ("d" * 500, "d" * 64, "domain_truncated"),
        (42, None, "domain_dropped"),
        (["math"], None, "domain_dropped"),
        ("ma\x00th\n", "math", None),
    ],
)
def test_a_domain_label_that_is_too_long_or_not_text_is_cut_or_dropped(tmp_path, label, stored, counted):
    capture = _capture(tmp_path)
    _offer(capture, body={"model": "m", "prompt": "x", "metadata": {"domain": label}})
    capture.flush()
    assert captured_rows(capture.config.path)[0]["domain"] == stored
    if counted:
        assert capture.stats()[counted] == 1


def test_a_full_store_keeps_the_newest_rows_and_old_ones_expire(tmp_path):
    now = [1_000_000.0]
    capture = TrafficCapture(
        CaptureConfig(path=tmp_path / "t.db", deployment="chat", rate=1.0, max_rows=10, retention_days=1.0),
        clock=lambda: now[0],
    )
    for index in range(30):
        _offer(capture, f"prompt {index}")
        capture.flush()  # one write each, so the bound is applied at every insert
    assert [r["prompt"] for r in captured_rows(capture.config.path)] == [f"prompt {i}" for i in range(20, 30)]
    now[0] += 2 * 86400
    _offer(capture, "a day later")
    capture.flush()
    assert [r["prompt"] for r in captured_rows(capture.config.path)] == ["a day later"]


def test_a_store_that_cannot_be_written_drops_samples_and_raises_nothing(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    capture = TrafficCapture(CaptureConfig(path=blocker / "t.db", deployment="chat", rate=1.0))
    for _ in range(5):
        _offer(capture)
    capture.flush()
    assert capture.stats()["dropped_store"] == 5 and capture.stats().get("captured", 0) == 0


def _router(tmp_path, upstream: str, capture: CaptureConfig) -> tuple[ServerProcess, str]:
    token = write_token_file(tmp_path / "router.token")
    port = free_port()
    argv = router_command("127.0.0.1", port, upstream, tmp_path / "router.token", capture)
    router = ServerProcess(argv, "127.0.0.1", port, tmp_path / "router.log", env={"DRAFTSYNC_ROUTER_TOKEN": ""})
    router.start()
    router.wait_healthy(timeout=60, health_path=LIVE_PATH)
    return router, token


@pytest.mark.parametrize("writable", [True, False])
def test_the_router_captures_what_it_serves_and_serves_everything_when_the_store_is_down(tmp_path, writable):
    upstream = HttpStub(lambda request: (200, "application/json", json.dumps(ANSWER)))
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    path = (tmp_path / "traffic" / "chat.db") if writable else (blocker / "chat.db")
    router, token = _router(tmp_path, upstream.url, CaptureConfig(path=path, deployment="chat", rate=1.0))
    try:
        for index in range(20):
            answer = httpx.post(
                f"{router.url}/v1/completions",
                json={"model": "m", "prompt": f"p{index}", "max_tokens": 4},
                headers={"X-Draftsync-Domain": "code"},
                timeout=30,
            )
            assert answer.status_code == 200 and answer.json() == ANSWER
        for _ in range(100):
            stats = httpx.get(f"{router.url}{CAPTURE_PATH}", headers={"Authorization": f"Bearer {token}"}).json()
            if stats.get("captured", 0) + stats.get("dropped_store", 0) == 20:
                break
            time.sleep(0.1)
        assert stats["enabled"] and stats["seen"] == 20
        if writable:
            rows = captured_rows(path)
            assert stats["captured"] == 20 and [r["prompt"] for r in rows] == [f"p{i}" for i in range(20)]
            assert {(r["domain"], r["accepted_tokens"], r["draft_tokens"]) for r in rows} == {("code", 24, 30)}
        else:
            assert stats["dropped_store"] == 20
        assert httpx.get(f"{router.url}{CAPTURE_PATH}").status_code == 401  # the counts need the router's token
    finally:
        router.stop()
        upstream.close()


def test_a_deployment_turns_capture_on_with_its_capture_section(tmp_path):
    from draftsync.errors import DraftsyncError
    from draftsync.serving.deployment import load_deployments

    path = tmp_path / "deployments.yaml"
    path.write_text(
        "deployments:\n  - name: chat\n    target_name: t\n"
        "    capture: {rate: 0.2, max_rows: 500, redact: 'tests.integration.serving.capture_hooks:mask_digits'}\n"
        "  - name: batch\n    target_name: t\n"
    )
    chat, batch = load_deployments(path)
    assert (chat.capture.rate, chat.capture.max_rows, chat.capture.keep_responses) == (0.2, 500, False)
    assert batch.capture is None  # off unless asked
    for bad, field in (
        ("{rate: 0}", "rate"),
        ("{rate: 2}", "rate"),
        ("{redact: 'not a path'}", "redact"),
        ("{keep: true}", "keep"),
    ):
        path.write_text(f"deployments:\n  - name: chat\n    target_name: t\n    capture: {bad}\n")
        with pytest.raises(DraftsyncError, match=f"capture.{field}"):
            load_deployments(path)
