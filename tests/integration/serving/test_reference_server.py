"""The reference server as a real subprocess on loopback, called over HTTP like vLLM would be."""

from __future__ import annotations

import concurrent.futures

import httpx
import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.process import ServerProcess, free_port
from draftsync.serving.reference_server import reference_server_command
from prometheus_client.parser import text_string_to_metric_families

from tests.support.tiny_models import build_tiny_drafter, build_tiny_target

MODEL = "tiny"
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)


def samples(metrics_text: str) -> dict[tuple[str, frozenset], float]:
    """Every sample keyed by (name, labels), via the Prometheus text parser."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
    }


def labels(**extra: str) -> frozenset:
    return frozenset({"model_name": MODEL, "engine": "0", **extra}.items())


def start_server(tmp_path, target, drafter=None, gamma=None) -> ServerProcess:
    port = free_port()
    argv = reference_server_command(target, drafter, gamma or 0, "127.0.0.1", port, MODEL)
    server = ServerProcess(argv, "127.0.0.1", port, tmp_path / "server.log", env={"DRAFTSYNC_TORCH_THREADS": "1"})
    server.start()
    try:
        server.wait_healthy(timeout=180)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def target_only(tiny_target, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("server"), tiny_target)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def target_model(tiny_target):
    from draftsync.speculative.targets import load_target

    return load_target(tiny_target)


def complete(server: ServerProcess, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, **body}, timeout=60)


def test_health_and_models(target_only, tiny_target):
    assert httpx.get(f"{target_only.url}/health").status_code == 200
    models = httpx.get(f"{target_only.url}/v1/models").json()
    assert [card["id"] for card in models["data"]] == [MODEL]
    assert models["data"][0]["root"] == str(tiny_target)
    assert models["data"][0]["max_model_len"] == 96


def test_greedy_completion_is_the_targets_greedy_continuation(target_only, target_model):
    from tests.support.greedy import greedy_reference

    model, tokenizer = target_model
    prompt = "def add(a, b):"
    response = complete(target_only, prompt=prompt, max_tokens=12, temperature=0)
    assert response.status_code == 200, response.text
    body = response.json()
    prompt_ids = tokenizer(prompt)["input_ids"]
    expected = greedy_reference(model, prompt_ids, 12)
    if tokenizer.eos_token_id in expected:
        expected = expected[: expected.index(tokenizer.eos_token_id) + 1]
    choice = body["choices"][0]
    assert choice["text"] == tokenizer.decode(expected, skip_special_tokens=True)
    assert choice["finish_reason"] == ("stop" if expected[-1] == tokenizer.eos_token_id else "length")
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(expected),
        "total_tokens": len(prompt_ids) + len(expected),
    }
    assert body["model"] == MODEL and body["object"] == "text_completion"
    assert body["draftsync"]["speculative"] is False
    assert body["draftsync"]["drafts"] == 0


def test_seeded_sampling_repeats_and_a_list_of_one_prompt_is_accepted(target_only):
    first = complete(target_only, prompt=["The sum of"], max_tokens=10, temperature=1.0, seed=7).json()
    second = complete(target_only, prompt="The sum of", max_tokens=10, temperature=1.0, seed=7).json()
    assert first["choices"][0]["text"] == second["choices"][0]["text"]


def test_concurrent_requests_are_served_one_at_a_time_with_the_same_results(target_only):
    prompts = ["def add(", "The sum of 12", "Permission is", "def add(a"]
    serial = [
        complete(target_only, prompt=p, max_tokens=8, temperature=0).json()["choices"][0]["text"] for p in prompts
    ]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        responses = list(pool.map(lambda p: complete(target_only, prompt=p, max_tokens=8, temperature=0), prompts))
    assert [r.status_code for r in responses] == [200] * 4
    assert [r.json()["choices"][0]["text"] for r in responses] == serial


def test_metrics_use_vllm_names_and_labels_and_count_requests(target_only):
    before = samples(httpx.get(f"{target_only.url}/metrics").text)
    body = complete(target_only, prompt="Permission is hereby", max_tokens=5, temperature=0).json()
    after = samples(httpx.get(f"{target_only.url}/metrics").text)
    reason = body["choices"][0]["finish_reason"]
    key = ("vllm:request_success_total", labels(finished_reason=reason))
    assert after[key] == before[key] + 1
    generated = ("vllm:generation_tokens_total", labels())
    assert after[generated] == before[generated] + body["usage"]["completion_tokens"]
    tpot_count = ("vllm:time_per_output_token_seconds_count", labels())
    assert after[tpot_count] == before[tpot_count] + 1
    # Like vLLM, no spec-decode series without a drafter: the scraper reads their absence as zero.
    assert not [name for name, _ in after if name.startswith(SPEC_COUNTERS)]


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": MODEL, "max_tokens": 4}, 400, "prompt"),
        ({"model": MODEL, "prompt": ["a", "b"]}, 400, "prompt"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": 10_000}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
        ({"model": MODEL, "prompt": "hi", "temperature": -1}, 400, "temperature"),
        ({"model": MODEL, "prompt": "hi", "seed": 1.5}, 400, "seed"),
        ({"model": "other-model", "prompt": "hi"}, 404, "model"),
        ({"model": MODEL, "prompt": "def add(a, b): " * 40, "max_tokens": 4}, 400, "prompt"),
    ],
)
def test_bad_requests_get_openai_style_errors(target_only, body, status, param):
    response = httpx.post(f"{target_only.url}/v1/completions", json=body, timeout=30)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["param"] == param and error["code"] == status and error["message"]


def test_a_body_that_is_not_json_is_a_400(target_only):
    response = httpx.post(f"{target_only.url}/v1/completions", content=b"{not json", timeout=30)
    assert response.status_code == 400
    assert "not valid JSON" in response.json()["error"]["message"]


def test_a_server_whose_target_is_missing_fails_with_the_reason_from_its_log(tmp_path):
    port = free_port()
    argv = reference_server_command(tmp_path / "no-such-target", None, 0, "127.0.0.1", port, MODEL)
    with ServerProcess(argv, "127.0.0.1", port, tmp_path / "server.log") as server:
        with pytest.raises(DraftsyncError) as raised:
            server.wait_healthy(timeout=120)
    assert "exited with code 2" in str(raised.value)
    assert "no-such-target does not exist" in str(raised.value)


GAMMA = 3


@pytest.fixture(scope="module")
def with_drafter(tiny_target, tiny_drafter, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("server"), tiny_target, tiny_drafter, GAMMA)
    yield server
    server.stop()


def test_speculative_greedy_output_is_lossless_and_spec_counters_match_the_requests(with_drafter, target_model):
    from tests.support.greedy import greedy_reference

    model, tokenizer = target_model
    models = httpx.get(f"{with_drafter.url}/v1/models").json()["data"][0]
    assert models["draftsync"]["gamma"] == GAMMA
    before = samples(httpx.get(f"{with_drafter.url}/metrics").text)
    for position in range(GAMMA):  # per-position series exist from the start, as in vLLM
        assert ("vllm:spec_decode_num_accepted_tokens_per_pos_total", labels(position=str(position))) in before

    totals = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "per_position": [0] * GAMMA}
    for prompt in ["def add(a, b):", "The sum of 12 and 30", "Permission is hereby"]:
        body = complete(with_drafter, prompt=prompt, max_tokens=16, temperature=0).json()
        expected = greedy_reference(model, tokenizer(prompt)["input_ids"], 16)
        if tokenizer.eos_token_id in expected:
            expected = expected[: expected.index(tokenizer.eos_token_id) + 1]
        assert body["choices"][0]["text"] == tokenizer.decode(expected, skip_special_tokens=True)
        stats = body["draftsync"]
        assert stats["speculative"] is True and stats["drafts"] > 0
        totals["drafts"] += stats["drafts"]
        totals["draft_tokens"] += stats["draft_tokens"]
        totals["accepted"] += stats["accepted"]
        totals["per_position"] = [
            a + b for a, b in zip(totals["per_position"], stats["accepted_per_position"], strict=True)
        ]

    after = samples(httpx.get(f"{with_drafter.url}/metrics").text)

    def advanced(name: str, **extra: str) -> float:
        key = (name, labels(**extra))
        return after[key] - before[key]

    assert advanced("vllm:spec_decode_num_drafts_total") == totals["drafts"] > 0
    assert advanced("vllm:spec_decode_num_draft_tokens_total") == totals["draft_tokens"]
    assert advanced("vllm:spec_decode_num_accepted_tokens_total") == totals["accepted"]
    assert [
        advanced("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(p)) for p in range(GAMMA)
    ] == totals["per_position"]
    assert sum(totals["per_position"]) == totals["accepted"]


def test_a_drafter_for_another_target_is_refused_at_start(tmp_path, tiny_target):
    wider = tmp_path / "wider-target"
    build_tiny_target(wider, seed=1, hidden_size=48)
    drafter = build_tiny_drafter(wider, tmp_path / "wider-drafter", gamma=2)
    port = free_port()
    argv = reference_server_command(tiny_target, drafter, 2, "127.0.0.1", port, MODEL)
    with ServerProcess(argv, "127.0.0.1", port, tmp_path / "server.log") as server:
        with pytest.raises(DraftsyncError, match="drafter expects a target with hidden size 48"):
            server.wait_healthy(timeout=120)
