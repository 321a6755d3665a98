"""The vLLM evaluation backend: reading per-request acceptance out of `LLM.get_metrics()` snapshots.

The readers are tested here on objects shaped exactly like vLLM's `vllm/v1/metrics/reader.py` classes
(dataclasses with `name`, `labels` and `value` / `values`), as `get_metrics()` returns them: counter
names without `_total`, one object per label set (engine), the per-position counter as a `Vector`.
The engine itself is tested where vllm and a GPU are present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.evaluation import EvalRequest
from draftsync.serving.vllm_args import render_vllm_command
from draftsync.serving.vllm_evaluation import (
    SpecDecodeCounts,
    VllmBackend,
    first_token_seconds,
    proposable_tokens,
    read_spec_decode_counts,
    resolve_method,
    speculative_config,
)


# ---- the shapes of vllm/v1/metrics/reader.py ----------------------------------------------------------------
@dataclass
class Metric:
    name: str
    labels: dict[str, str]


@dataclass
class Counter(Metric):
    value: int


@dataclass
class Vector(Metric):
    values: list[int]


@dataclass
class Gauge(Metric):
    value: float


@dataclass
class Histogram(Metric):
    count: int
    sum: float
    buckets: dict[str, int]


def engine_labels(engine: str = "0") -> dict[str, str]:
    return {"model_name": "target", "engine": engine}


def spec_metrics(
    drafts: int, draft_tokens: int, accepted: int, per_position: list[int], engine: str = "0"
) -> list[Metric]:
    """One engine's spec-decode counters, as get_metrics() lists them."""
    labels = engine_labels(engine)
    return [
        Counter("vllm:spec_decode_num_drafts", labels, drafts),
        Counter("vllm:spec_decode_num_draft_tokens", labels, draft_tokens),
        Counter("vllm:spec_decode_num_accepted_tokens", labels, accepted),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos", labels, per_position),
    ]


def other_metrics() -> list[Metric]:
    """Metrics every snapshot also holds, which the reader must leave alone."""
    labels = engine_labels()
    return [
        Gauge("vllm:num_requests_running", labels, 1.0),
        Counter("vllm:prompt_tokens", labels, 9000),
        Counter("vllm:generation_tokens", labels, 7000),
        Histogram("vllm:time_to_first_token_seconds", labels, 3, 0.12, {"0.1": 2, "+Inf": 3}),
    ]


# ---- reading snapshots --------------------------------------------------------------------------------------
def test_counters_are_read_by_name_and_other_metrics_are_skipped():
    counts = read_spec_decode_counts(other_metrics() + spec_metrics(10, 30, 17, [8, 6, 3]))
    assert counts == SpecDecodeCounts(drafts=10, draft_tokens=30, accepted=17, accepted_per_position=(8, 6, 3))


def test_counters_of_several_engines_are_summed():
    """Under data parallelism get_metrics() returns one object per engine label."""
    snapshot = spec_metrics(10, 30, 17, [8, 6, 3], engine="0") + spec_metrics(4, 12, 5, [3, 2, 0], engine="1")
    assert read_spec_decode_counts(snapshot) == SpecDecodeCounts(14, 42, 22, (11, 8, 3))


def test_a_snapshot_without_speculation_reads_as_zero():
    """An engine without speculative_config registers no spec-decode counters at all."""
    assert read_spec_decode_counts(other_metrics()) == SpecDecodeCounts(0, 0, 0, ())


def test_scraped_names_with_the_total_suffix_read_the_same():
    labels = engine_labels()
    scraped = [
        Counter("vllm:spec_decode_num_drafts_total", labels, 5),
        Counter("vllm:spec_decode_num_draft_tokens_total", labels, 10),
        Counter("vllm:spec_decode_num_accepted_tokens_total", labels, 7),
        Vector("vllm:spec_decode_num_accepted_tokens_per_pos_total", labels, [4, 3]),
    ]
    assert read_spec_decode_counts(scraped) == SpecDecodeCounts(5, 10, 7, (4, 3))


def test_a_spec_metric_of_the_wrong_shape_is_named():
    labels = engine_labels()
    with pytest.raises(DraftsyncError, match="spec_decode_num_accepted_tokens_per_pos is not a per-position Vector"):
        read_spec_decode_counts([Counter("vllm:spec_decode_num_accepted_tokens_per_pos", labels, 3)])
    with pytest.raises(DraftsyncError, match="spec_decode_num_drafts has no counter value"):
        read_spec_decode_counts([Vector("vllm:spec_decode_num_drafts", labels, [1, 2])])


def test_a_request_is_the_difference_of_the_snapshots_around_it():
    before = read_spec_decode_counts(other_metrics() + spec_metrics(10, 30, 17, [8, 6, 3]))
    after = read_spec_decode_counts(other_metrics() + spec_metrics(16, 48, 29, [12, 10, 7]))
    request = after.since(before)
    assert request == SpecDecodeCounts(drafts=6, draft_tokens=18, accepted=12, accepted_per_position=(4, 4, 4))


def test_the_first_request_of_an_engine_starts_from_empty_counters():
    """Before anything was drafted the per-position Vector may be shorter (or absent): it is padded with zeros."""
    before = read_spec_decode_counts(other_metrics())
    after = read_spec_decode_counts(spec_metrics(3, 6, 4, [3, 1]))
    assert after.since(before) == SpecDecodeCounts(3, 6, 4, (3, 1))


def test_counters_that_went_down_mean_a_restarted_engine():
    before = read_spec_decode_counts(spec_metrics(16, 48, 29, [12, 10, 7]))
    after = read_spec_decode_counts(spec_metrics(2, 6, 3, [2, 1, 0]))
    with pytest.raises(DraftsyncError, match="went down") as caught:
        after.since(before)
    assert "same running LLM" in caught.value.fix


# ---- time to first token ------------------------------------------------------------------------------------
@dataclass
class RequestStateStats:
    """vllm/v1/metrics/stats.py: what RequestOutput.metrics holds on the V1 engine."""

    num_generation_tokens: int = 0
    arrival_time: float = 0.0
    queued_ts: float = 0.0
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    first_token_latency: float = 0.0
    is_corrupted: bool = False


@dataclass
class RequestMetrics:
    """The older engine's RequestOutput.metrics: wall-clock stamps."""

    arrival_time: float
    last_token_time: float
    first_scheduled_time: float | None
    first_token_time: float | None
    time_in_queue: float | None
    finished_time: float | None = None


def test_time_to_first_token_comes_from_the_request_metrics():
    v1 = RequestStateStats(
        num_generation_tokens=32,
        arrival_time=1000.0,
        queued_ts=5.0,
        scheduled_ts=5.01,
        first_token_ts=5.04,
        last_token_ts=5.5,
        first_token_latency=0.045,
    )
    assert first_token_seconds(v1) == pytest.approx(0.045)
    older = RequestMetrics(
        arrival_time=100.0,
        last_token_time=101.0,
        first_scheduled_time=100.01,
        first_token_time=100.25,
        time_in_queue=0.01,
    )
    assert first_token_seconds(older) == pytest.approx(0.25)


def test_time_to_first_token_is_nan_when_not_reported():
    assert math.isnan(first_token_seconds(None))
    assert math.isnan(first_token_seconds(RequestStateStats()))  # no first token recorded
    assert math.isnan(first_token_seconds(RequestMetrics(100.0, 101.0, None, None, None)))


# ---- speculative configs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["eagle3", "eagle3.1", "eagle"])
@pytest.mark.parametrize("tensor_parallel_size", [1, 2])
def test_eagle_drafters_get_the_config_they_are_served_with(method, tensor_parallel_size):
    config = speculative_config("/models/target", method, "/models/drafter", 4, tensor_parallel_size)
    served = render_vllm_command(
        "/models/target", "/models/drafter", method, 4, "0.0.0.0", 8000, "tiny", tensor_parallel_size
    ).speculative_config
    assert config == served
    assert config["method"] == ("eagle" if method == "eagle" else "eagle3")
    assert config["num_speculative_tokens"] == 4
    assert ("draft_tensor_parallel_size" in config) == (tensor_parallel_size > 1)


def test_gamma_zero_turns_speculation_off():
    assert speculative_config("/t", "eagle3", "/d", 0) is None
    assert speculative_config("/t", None, None, 0) is None
    with pytest.raises(DraftsyncError, match="without a drafter"):
        speculative_config("/t", None, None, 2)
    with pytest.raises(DraftsyncError, match="negative"):
        speculative_config("/t", "eagle3", "/d", -1)


def test_ngram_gets_its_lookup_window_explicitly():
    assert speculative_config("/t", "ngram", None, 3) == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 5,
        "prompt_lookup_max": 5,
    }
    assert speculative_config("/t", "ngram", None, 3, prompt_lookup_max=4)["prompt_lookup_min"] == 4
    window = speculative_config("/t", "ngram", None, 3, prompt_lookup_min=2, prompt_lookup_max=6)
    assert (window["prompt_lookup_min"], window["prompt_lookup_max"]) == (2, 6)
    with pytest.raises(DraftsyncError, match="min=6, max=2"):
        speculative_config("/t", "ngram", None, 3, prompt_lookup_min=6, prompt_lookup_max=2)


def test_draft_models_load_their_directory():
    assert speculative_config("/t", "draft_model", "/d", 2, 2) == {
        "method": "draft_model",
        "model": "/d",
        "num_speculative_tokens": 2,
        "draft_tensor_parallel_size": 2,
    }


@pytest.fixture(scope="module")
def medusa_drafter(tiny_target, tmp_path_factory):
    from draftsync.speculative.drafters import new_drafter, save_drafter
    from draftsync.speculative.targets import load_target

    target, _ = load_target(tiny_target)
    drafter = new_drafter("medusa", target.config, num_heads=2, num_layers=1)
    return save_drafter(
        drafter, tmp_path_factory.mktemp("medusa"), str(tiny_target), list(target.config.architectures), 2
    )


def test_medusa_drafters_get_the_config_they_are_served_with_up_to_their_heads(tiny_target, medusa_drafter):
    config = speculative_config(tiny_target, "medusa", medusa_drafter, 2)
    assert (
        config
        == render_vllm_command(tiny_target, medusa_drafter, "medusa", 2, "0.0.0.0", 8000, "tiny").speculative_config
    )
    assert config == {"method": "medusa", "model": str(medusa_drafter), "num_speculative_tokens": 2}
    with pytest.raises(DraftsyncError, match="gamma 3 asks for more tokens than the 2 heads") as caught:
        speculative_config(tiny_target, "medusa", medusa_drafter, 3)
    assert "gamma <= 2" in caught.value.fix


def test_a_drafter_proposes_up_to_its_heads_or_as_far_as_asked(tiny_drafter, medusa_drafter, tmp_path):
    assert proposable_tokens("medusa", medusa_drafter) == 2
    assert proposable_tokens("eagle3", tiny_drafter) == proposable_tokens("ngram", None) == 16
    assert proposable_tokens(None, None) == 0
    (tmp_path / "config.json").write_text('{"draftsync_drafter": "medusa"}')
    with pytest.raises(DraftsyncError, match="no number of heads") as caught:
        proposable_tokens("medusa", tmp_path)
    assert "save_drafter" in caught.value.fix


def test_the_backend_sweeps_a_medusa_drafter_up_to_its_heads(tiny_target, medusa_drafter):
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("the backend needs vllm installed")
    backend = VllmBackend(tiny_target, medusa_drafter)
    assert (backend.method, backend.max_gamma) == ("medusa", 2)
    assert backend.speculative_config(2)["num_speculative_tokens"] == 2
    with pytest.raises(DraftsyncError, match=r"gamma 3 is more than this drafter proposes \(2\)"):
        backend.speculative_config(3)


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


def test_the_backend_refuses_arguments_that_would_break_its_counts(tiny_target, tiny_drafter):
    with pytest.raises(DraftsyncError, match="disable_log_stats"):
        VllmBackend(tiny_target, tiny_drafter, disable_log_stats=True)
    with pytest.raises(DraftsyncError, match="speculative_config"):
        VllmBackend(tiny_target, tiny_drafter, speculative_config={"method": "ngram"})
    with pytest.raises(DraftsyncError, match="tensor_parallel_size 0"):
        VllmBackend(tiny_target, tiny_drafter, tensor_parallel_size=0)
    with pytest.raises(DraftsyncError, match="min=3, max=1"):
        VllmBackend(tiny_target, None, "ngram", prompt_lookup_min=3, prompt_lookup_max=1)


def test_without_vllm_the_backend_says_where_to_run(tiny_target, tiny_drafter):
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vllm is installed here")
    with pytest.raises(DraftsyncError, match="vllm is not installed") as caught:
        VllmBackend(tiny_target, tiny_drafter)
    assert "ReferenceBackend" in caught.value.fix


# ---- the engine (GPU workers) -------------------------------------------------------------------------------
@pytest.mark.slow
def test_vllm_counts_each_request_on_its_own(tmp_path_factory):
    pytest.importorskip("vllm")
    import torch

    if not torch.cuda.is_available():
        pytest.skip("vLLM's engine needs a GPU")
    from draftsync.speculative.corpora import prompts
    from draftsync.speculative.drafters import new_drafter, save_drafter
    from draftsync.speculative.targets import build_target, builtin_recipe, load_target

    target_dir = build_target(builtin_recipe(1, "test"), tmp_path_factory.mktemp("target-cache"))
    target, _ = load_target(target_dir)
    torch.manual_seed(0)
    drafter = new_drafter("eagle3", target.config)
    drafter.initialise_from_target(target)
    drafter_dir = save_drafter(
        drafter, tmp_path_factory.mktemp("drafter"), str(target_dir), list(target.config.architectures), 3
    )
    del target
    max_tokens, gamma = 48, 3
    requests = [EvalRequest(p, task, max_tokens) for task in ("code", "math") for p in prompts(task, 2, seed=0)]

    backend = VllmBackend(target_dir, drafter_dir, gpu_memory_utilization=0.3, max_model_len=512, enforce_eager=True)
    try:
        plain = backend.generate(requests, 0, 0.0, seed=0)
        llm = backend.llm(gamma)
        before = read_spec_decode_counts(llm.get_metrics())
        speculative = backend.generate(requests, gamma, 0.0, seed=0)
        assert backend.llm(gamma) is llm  # one engine per gamma, reused
        whole_run = read_spec_decode_counts(llm.get_metrics()).since(before)
    finally:
        backend.close()

    for result in plain:
        assert (result.drafts, result.draft_tokens, result.accepted, result.accepted_per_position) == (0, 0, 0, [])
        assert result.output_tokens == max_tokens  # ignore_eos: the same load as the reference engine
        assert 0 < result.ttft_s < result.seconds
    for result in speculative:
        n = result.output_tokens
        assert n == max_tokens and 0 < result.ttft_s < result.seconds
        assert result.drafts >= 1
        assert result.accepted <= result.draft_tokens <= gamma * result.drafts
        assert len(result.accepted_per_position) == gamma and sum(result.accepted_per_position) == result.accepted
        assert all(a >= b for a, b in zip(result.accepted_per_position, result.accepted_per_position[1:], strict=False))
        # Each verify step emits its accepted tokens plus one; every step but the last ended short of n tokens,
        # so counts leaking in from another request would break this bound.
        assert result.accepted + result.drafts <= n - 1 + gamma
    assert whole_run == SpecDecodeCounts(
        sum(r.drafts for r in speculative),
        sum(r.draft_tokens for r in speculative),
        sum(r.accepted for r in speculative),
        tuple(sum(r.accepted_per_position[i] for r in speculative) for i in range(gamma)),
    )
