"""The target's own responses, whoever writes them: the same sample shape, seeds fixed by position, the writer
chosen by setting and recorded. vLLM itself is exercised in tests/e2e/vllm/test_vllm_responses.py."""

from __future__ import annotations

import sys

import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.vllm_responses import VllmResponseWriter, response_writer
from draftsync.speculative.data.responses import response_sample, response_seed
from draftsync.speculative.data.samples import concat_samples, regenerated_samples, teacher_forced_samples

EOS = 0
PROMPTS = [("code", "def add(a, b):"), ("math", "The sum of 12")]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from draftsync.speculative.builtin.tokenizer import train_tokenizer

    from tests.support.tiny_models import TEXTS

    return train_tokenizer(TEXTS, vocab_size=320, out_dir=tmp_path_factory.mktemp("tokenizer"))


def test_a_response_ends_at_its_first_eos_kept_and_only_it_is_trained_on():
    assert response_sample([5, 6], [7, EOS, EOS, EOS], EOS) == ([5, 6, 7, EOS], [0, 0, 1, 1])
    assert response_sample([5], [7, 8], EOS) == ([5, 7, 8], [0, 1, 1])  # cut at max tokens: no EOS to keep
    assert response_sample([5], [EOS], EOS) == ([5, EOS], [0, 1])


def test_each_response_has_its_own_seed_fixed_by_its_position():
    seeds = [response_seed(seed, position) for seed in (0, 1) for position in range(500)]
    assert seeds == [response_seed(seed, position) for seed in (0, 1) for position in range(500)]
    assert len(set(seeds)) == len(seeds) and all(0 <= s < 2**31 for s in seeds)
    assert response_seed(0, 1) != response_seed(1, 0)  # a retrain's seed + 1 is not the same draw shifted


def test_the_writer_setting_picks_vllm_when_an_engine_is_configured_and_hf_always_works(monkeypatch):
    monkeypatch.setenv("DRAFTSYNC_VLLM", sys.executable)  # an interpreter counts as an engine until it starts
    assert response_writer("auto") == "vllm" and response_writer("vllm") == "vllm"
    assert response_writer("hf") == "hf"
    monkeypatch.setenv("DRAFTSYNC_VLLM", "/nonexistent/vllm")
    with pytest.raises(DraftsyncError) as error:
        response_writer("vllm")
    assert "DRAFTSYNC_VLLM" in error.value.what and "response_writer: hf" in error.value.fix
    with pytest.raises(DraftsyncError, match="unknown response writer"):
        response_writer("sglang")


def test_the_writer_is_part_of_the_fingerprint_and_named_by_the_stream(tokenizer, tmp_path):
    by_hf = regenerated_samples(None, tokenizer, PROMPTS, 8)
    open_writer = lambda: VllmResponseWriter(tmp_path, tmp_path)  # noqa: E731
    by_vllm = regenerated_samples(None, tokenizer, PROMPTS, 8, writer="vllm", open_writer=open_writer)
    assert by_hf.fingerprint != by_vllm.fingerprint  # a build is not resumed with the other engine's responses
    assert (by_hf.writer, by_vllm.writer) == ("hf", "vllm")
    texts = teacher_forced_samples(tokenizer, [("code", "x = 1")])
    assert texts.writer is None and concat_samples(texts, by_vllm).writer == "vllm"
    assert concat_samples(texts).writer is None


def test_vllm_responses_need_a_writer_and_a_started_server(tokenizer, tmp_path):
    with pytest.raises(DraftsyncError, match="open_writer=lambda: VllmResponseWriter"):
        regenerated_samples(None, tokenizer, PROMPTS, 8, writer="vllm")
    with pytest.raises(DraftsyncError, match="unknown response writer"):
        regenerated_samples(None, tokenizer, PROMPTS, 8, writer="sglang")
    writer = VllmResponseWriter(tmp_path, tmp_path)
    with pytest.raises(DraftsyncError, match="not started"):
        writer.complete([1, 2], 4, 0.0, 0)


def test_a_tokenizer_without_a_pad_token_writes_batched_responses_as_it_writes_them_one_by_one(tokenizer):
    """Llama-3's tokenizer has no pad token: the batch is padded with EOS, on the left, and the tokenizer kept as
    it came."""
    import copy

    from draftsync.speculative.data.responses import generate_responses

    from tests.support.speculative_fixtures import tiny_llama

    padless = copy.deepcopy(tokenizer)
    padless.pad_token = None
    prompts = ["def add(a, b):", "The sum of 12 and 30 is", "x"]
    assert len({len(padless(prompt)["input_ids"]) for prompt in prompts}) == 3  # the batch needs padding
    model = tiny_llama()
    batched = generate_responses(model, padless, prompts, max_new_tokens=6, batch_size=3)
    assert padless.pad_token is None and padless.padding_side == "right"
    alone = [generate_responses(model, padless, [prompt], max_new_tokens=6) for prompt in prompts]
    assert batched == ([ids for (ids,), _ in alone], [mask for _, (mask,) in alone])
    assert [mask.count(0) for mask in batched[1]] == [len(padless(prompt)["input_ids"]) for prompt in prompts]
