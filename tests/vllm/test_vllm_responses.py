"""Training data whose responses real vLLM writes: shards that pass the data checks, a manifest that names the engine,
the server gone afterwards, the same greedy responses as the Hugging Face loop, and seeds that follow positions.

Two vLLM starts in all: one inside a shard build (the dataset builder's own path), one for the sampled responses.
"""

from __future__ import annotations

import re
import socket

import pytest

pytestmark = pytest.mark.vllm

MIX = {"code": 0.5, "math": 0.5}
PROMPTS = 48
MAX_TOKENS = 32


@pytest.fixture(scope="module")
def target(built_targets):
    from draftsync.speculative.targets import load_target

    model, tokenizer = load_target(built_targets[1])
    return built_targets[1], model, tokenizer


@pytest.fixture(scope="module")
def prompts():
    from draftsync.speculative.corpora import task_prompts_for_mix

    return task_prompts_for_mix(MIX, PROMPTS, seed=104, split="train")


@pytest.fixture(scope="module")
def vllm_build(target, prompts, vllm_engine, tmp_path_factory):
    """Shards of texts and of responses vLLM wrote at T=0, built as `build_dataset` builds them."""
    from draftsync.speculative.corpora import mixed_texts
    from draftsync.speculative.hidden_states import default_aux_layer_ids, num_decoder_layers
    from draftsync.speculative.samples import concat_samples, regenerated_samples, teacher_forced_samples
    from draftsync.speculative.shard_writer import build_shards

    target_dir, model, tokenizer = target
    root = tmp_path_factory.mktemp("vllm-responses")
    samples = concat_samples(
        teacher_forced_samples(tokenizer, mixed_texts(MIX, 40, seed=3)),
        regenerated_samples(
            model, tokenizer, prompts, MAX_TOKENS, writer="vllm", target_dir=target_dir, log_dir=root / "logs"
        ),
    )
    layers = default_aux_layer_ids(num_decoder_layers(model))
    manifest = build_shards(model, samples, root / "shards", layers, store_aux=True, batch_size=8)
    return root, manifest


def _stored_sequences(shards_dir, manifest) -> list[tuple[list[int], list[int]]]:
    """Every sequence of the dataset, in build order, as (token ids, loss mask) read back from the shards."""
    from safetensors.torch import load_file

    out = []
    for shard in manifest["shards"]:
        tensors = load_file(str(shards_dir / shard["file"]))
        offsets = tensors["offsets"].tolist()
        for begin, end in zip(offsets, offsets[1:], strict=False):
            out.append(
                (tensors["input_ids"][begin:end].tolist(), [int(m) for m in tensors["loss_mask"][begin:end].tolist()])
            )
    return out


def test_vllm_written_responses_pass_the_data_checks_and_the_manifest_names_the_engine(target, vllm_build):
    from draftsync.speculative.shard_reader import ShardDataset
    from draftsync.validation.data_checks import run_data_checks

    _, model, _ = target
    root, manifest = vllm_build
    assert manifest["complete"] and manifest["num_sequences"] == 40 + PROMPTS
    assert manifest["response_writer"] == "vllm" and manifest["mode"] == "teacher_forced+regenerated"
    report = run_data_checks(ShardDataset(root / "shards"), model.config, MIX)  # raises on a failed expectation
    assert report.passed
    # The server is stopped once the build has its last response: nothing answers on its port any more.
    (log,) = (root / "logs").glob("responses-*.log")
    port = int(re.fullmatch(r"responses-(\d+)\.log", log.name).group(1))
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_greedy_vllm_responses_equal_the_hugging_face_loops(target, prompts, vllm_build):
    """float32 on CPU at T=0: the same prompt ids, the same responses, EOS kept where a response ended on it."""
    from draftsync.speculative.samples import regenerated_samples

    _, model, tokenizer = target
    root, manifest = vllm_build
    by_vllm = _stored_sequences(root / "shards", manifest)[-PROMPTS:]
    by_hf = [(s.input_ids, s.loss_mask) for s in regenerated_samples(model, tokenizer, prompts, MAX_TOKENS)]
    differing = [index for index, (a, b) in enumerate(zip(by_hf, by_vllm, strict=True)) if a != b]
    assert not differing, f"{len(differing)} of {PROMPTS} greedy responses differ: {differing}"
    ended = sum(ids[-1] == tokenizer.eos_token_id for ids, _ in by_vllm)
    assert 0 < ended < PROMPTS  # some stopped on EOS (kept), some ran to max_tokens


def test_sampled_responses_follow_their_positions_so_a_resumed_build_matches_a_full_one(
    target, prompts, vllm_engine, tmp_path
):
    """At T=1 each response's seed comes from its position: prompts answered from position 20 on give what the
    run from the start gave there, although vLLM batched them with other requests."""
    from draftsync.speculative.responses import VllmResponseWriter

    target_dir, _, tokenizer = target
    texts = [prompt for _, prompt in prompts]
    with VllmResponseWriter(target_dir, tmp_path, engine=vllm_engine) as writer:
        full = list(writer.responses(tokenizer, texts, MAX_TOKENS, temperature=1.0, seed=7))
        resumed = list(writer.responses(tokenizer, texts[20:], MAX_TOKENS, temperature=1.0, seed=7, first=20))
        greedy = list(writer.responses(tokenizer, texts[:20], MAX_TOKENS))
        reseeded = list(writer.responses(tokenizer, texts, MAX_TOKENS, temperature=1.0, seed=8))
    assert resumed == full[20:]
    assert greedy != full[:20] and reseeded != full  # it did sample, and another seed samples otherwise
