"""The vLLM evaluation backend without an engine: reading vLLM's per-request counts and timings out of a completion
response, and which method and gamma a drafter is served with. The backend against real vLLM servers is tested in
tests/e2e/vllm/test_vllm_checklist.py.

Responses here have the shape of vLLM 0.32's `CompletionResponse` (vllm/entrypoints/openai/completion/protocol.py)
with `metrics` as `PerRequestMetrics` (vllm/entrypoints/generate/base/protocol.py).
"""

from __future__ import annotations

import math

import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.evaluation import EvalRequest
from draftsync.serving.vllm_args import SpeculationSpec, render_vllm_command
from draftsync.serving.vllm_evaluation import (
    VllmBackend,
    accepted_per_position,
    proposable_tokens,
    request_result,
    resolve_method,
)

REQUEST = EvalRequest("def f(x):", "code", 6)


def response(token_ids: list[int], metrics: dict | None) -> dict:
    body = {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "evaluation",
        "choices": [{"index": 0, "text": "...", "token_ids": token_ids, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 4, "completion_tokens": len(token_ids), "total_tokens": 4 + len(token_ids)},
    }
    if metrics is not None:
        body["metrics"] = metrics
    return body


# Three verify steps at gamma 3 accepted 3, 1 and 0 drafts (histogram index j: steps that accepted exactly j).
SPEC = {
    "mean_acceptance_length": 1 + 4 / 3,
    "draft_acceptance_rate": 4 / 9,
    "acceptance_histogram": [1, 1, 0, 1],
    "num_spec_steps": 3,
    "num_accepted_draft_tokens": 4,
    "num_draft_tokens": 9,
    "num_spec_tokens": 3,
}
TIMING = {"time_to_first_token_ms": 40.0, "generation_time_ms": 100.0, "mean_itl_ms": 20.0}


def test_per_position_counts_follow_from_the_acceptance_histogram():
    assert accepted_per_position([1, 1, 0, 1], 3) == [2, 1, 1]  # steps that accepted more than 0, 1, 2 drafts
    assert accepted_per_position([5, 0, 0], 2) == [0, 0]
    assert accepted_per_position([0, 0, 4], 2) == [4, 4]


def test_a_response_reads_as_vllms_own_counts_and_timings():
    result = request_result(
        7, REQUEST, 4, response([1, 2, 3, 4, 5, 6], {**TIMING, "speculative_decoding": SPEC}), 3, "u"
    )
    assert (result.index, result.task, result.prompt_tokens, result.output_tokens) == (7, "code", 4, 6)
    assert (result.drafts, result.draft_tokens, result.accepted) == (3, 9, 4)
    assert result.accepted_per_position == [2, 1, 1]
    assert sum(result.accepted_per_position) == result.accepted
    assert result.token_ids == [1, 2, 3, 4, 5, 6]
    assert result.ttft_s == pytest.approx(0.040)
    assert result.tpot_ms == pytest.approx(100.0 / 5)  # vLLM's decode time over the tokens after the first


def test_plain_decoding_has_no_counts_and_needs_none():
    result = request_result(0, REQUEST, 4, response([1, 2, 3], TIMING), 0, "u")
    assert (result.drafts, result.draft_tokens, result.accepted, result.accepted_per_position) == (0, 0, 0, [])
    assert result.tpot_ms == pytest.approx(50.0)


def test_a_speculative_answer_without_per_request_counts_is_refused_not_counted_as_zero():
    with pytest.raises(DraftsyncError, match="without per-request spec-decode counts") as caught:
        request_result(0, REQUEST, 4, response([1, 2, 3], TIMING), 3, "http://127.0.0.1:9")
    assert "http://127.0.0.1:9" in caught.value.what
    assert "0.32" in caught.value.fix and "--backend reference" in caught.value.fix


def test_without_per_request_timing_tpot_is_nan_so_speed_gates_fail():
    result = request_result(0, REQUEST, 4, response([1, 2, 3], {"speculative_decoding": SPEC}), 3, "u")
    assert math.isnan(result.ttft_s) and math.isnan(result.tpot_ms)


def test_the_backend_launches_what_a_rollout_serves_plus_per_request_timing(tiny_target, tiny_drafter, tmp_path):
    backend = VllmBackend(tiny_target, tiny_drafter, log_dir=tmp_path)
    launch = backend.launch(3, 8123)
    speculation = SpeculationSpec(method="eagle3", model=tiny_drafter, num_speculative_tokens=3)
    served = render_vllm_command(tiny_target, port=8123, served_model_name="evaluation", speculation=speculation)
    assert launch.speculative_config == served.speculative_config
    assert launch.argv == [*served.argv, "--enable-per-request-metrics"]
    assert "--per-request-spec-decode-metrics" in launch.argv
    plain = backend.launch(0, 8124)
    assert plain.speculative_config is None and "--speculative-config" not in plain.argv
    assert "--per-request-spec-decode-metrics" not in plain.argv  # vLLM refuses it without speculation
    assert backend.starts == 0


def test_ngram_gets_its_lookup_window_and_a_bad_one_is_refused_at_once(tiny_target, tmp_path):
    backend = VllmBackend(tiny_target, None, "ngram", log_dir=tmp_path, prompt_lookup_min=2, prompt_lookup_max=6)
    config = backend.launch(3, 0).speculative_config
    assert (config["method"], config["prompt_lookup_min"], config["prompt_lookup_max"]) == ("ngram", 2, 6)
    with pytest.raises(DraftsyncError, match="min=3, max=1"):
        VllmBackend(tiny_target, None, "ngram", log_dir=tmp_path, prompt_lookup_min=3, prompt_lookup_max=1)


@pytest.fixture(scope="module")
def medusa_drafter(tiny_target, tmp_path_factory):
    from draftsync.speculative.methods.registry import new_drafter, save_drafter
    from draftsync.speculative.targets import load_target

    target, _ = load_target(tiny_target)
    drafter = new_drafter("medusa", target.config, num_heads=2, num_layers=1)
    return save_drafter(
        drafter, tmp_path_factory.mktemp("medusa"), str(tiny_target), list(target.config.architectures), 2
    )


def test_a_drafter_proposes_up_to_its_heads_or_as_far_as_asked(tiny_drafter, medusa_drafter, tmp_path):
    assert proposable_tokens("medusa", medusa_drafter) == 2
    assert proposable_tokens("eagle3", tiny_drafter) == proposable_tokens("ngram", None) == 16
    assert proposable_tokens(None, None) == 0
    (tmp_path / "config.json").write_text('{"draftsync_drafter": "medusa"}')
    with pytest.raises(DraftsyncError, match=r"does not bound its medusa drafter's gamma \(num_heads=None\)") as caught:
        proposable_tokens("medusa", tmp_path)
    assert "save_drafter" in caught.value.fix
    (tmp_path / "config.json").write_text('{"draftsync_drafter": "dflash", "max_draft_tokens": 5}')
    assert proposable_tokens("dflash", tmp_path) == 5


def test_the_backend_sweeps_a_medusa_drafter_up_to_its_heads(tiny_target, medusa_drafter, tmp_path):
    backend = VllmBackend(tiny_target, medusa_drafter, log_dir=tmp_path)  # no server starts until asked
    assert (backend.method, backend.max_gamma) == ("medusa", 2)
    assert backend.launch(2, 0).speculative_config["num_speculative_tokens"] == 2
    with pytest.raises(DraftsyncError, match=r"gamma 3 is more than this drafter proposes \(2\)"):
        backend.launch(3, 0)


# ---- which method a drafter directory holds -----------------------------------------------------------------
def test_the_method_is_read_from_the_drafter_directory(tiny_drafter, medusa_drafter):
    assert resolve_method(tiny_drafter, None) == "eagle3"
    assert resolve_method(tiny_drafter, "eagle3") == "eagle3"
    assert resolve_method(tiny_drafter, "eagle3.1") == "eagle3"  # vLLM runs both as eagle3
    assert resolve_method(medusa_drafter, None) == resolve_method(medusa_drafter, "medusa") == "medusa"
    assert resolve_method(None, None) is None
    assert resolve_method(None, "ngram") == "ngram"


def test_a_method_that_does_not_match_the_drafter_is_named(tiny_drafter, tiny_target, medusa_drafter):
    with pytest.raises(DraftsyncError, match="holds a 'eagle3' drafter"):
        resolve_method(tiny_drafter, "eagle")
    with pytest.raises(DraftsyncError, match="holds a 'medusa' drafter"):
        resolve_method(medusa_drafter, "eagle3")
    with pytest.raises(DraftsyncError, match="drafts from the prompt"):
        resolve_method(tiny_drafter, "ngram")
    with pytest.raises(DraftsyncError, match="without a drafter directory"):
        resolve_method(None, "eagle3")
    with pytest.raises(DraftsyncError, match="not the config of a drafter"):
        resolve_method(tiny_target, None)
    with pytest.raises(DraftsyncError, match="unknown to the vLLM backend"):
        resolve_method(None, "eagle4")
