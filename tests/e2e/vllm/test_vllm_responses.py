"""Training data whose responses real vLLM writes: shards that pass the data checks, a manifest that names the engine,
the server gone afterwards, the same greedy responses as the Hugging Face loop, and seeds that follow positions.

Two vLLM starts in all: one inside the dataset builder's own run, one for the sampled responses.
"""

from __future__ import annotations

import json
import re
import socket

import pytest
from draftsync.speculative.data.shard_manifest import MANIFEST_FILE

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
def chosen():
    """The test sync profile, asking vLLM to write its responses (the profile itself pins the HF loop)."""
    from draftsync.profiles import profile

    return profile("test").model_copy(
        update={
            "training_texts": 40,
            "generated_samples": PROMPTS,
            "generated_max_tokens": MAX_TOKENS,
            "response_writer": "vllm",
        }
    )


@pytest.fixture(scope="module")
def prompts(chosen):
    """The prompts `build_dataset` draws for the profile."""
    from draftsync.speculative.data.corpora import task_prompts_for_mix

    return task_prompts_for_mix(MIX, PROMPTS, seed=chosen.seed + 100, split="train")


@pytest.fixture(scope="module")
def vllm_build(target, chosen, vllm_engine, prefect_harness, tmp_path_factory):
    """The dataset builder's own run (the sync's `build-dataset` task) with vLLM writing the responses at T=0; it
    records how many targets the builder's process held loaded when the server started."""
    from draftsync.serving import vllm_responses
    from draftsync.speculative import placement
    from draftsync.tasks import context
    from draftsync.tasks.dataset import build_dataset

    loaded_at_start: list[int] = []

    class Watched(vllm_responses.VllmResponseWriter):
        def __enter__(self):
            loaded_at_start.append(len(placement._shared))
            return super().__enter__()

    target_dir, _, _ = target
    root = tmp_path_factory.mktemp("vllm-responses")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTSYNC_WORKDIR", str(root / "work"))
        patch.setattr(vllm_responses, "VllmResponseWriter", Watched)
        context.reset()
        placement.release_shared_targets()
        data = build_dataset.fn(str(target_dir), MIX, chosen, str(root / "shards"))  # raises on failed data checks
    context.reset()
    placement.release_shared_targets()
    return root, data, json.loads((root / "shards" / MANIFEST_FILE).read_text()), loaded_at_start


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


def test_the_response_server_starts_before_the_target_is_loaded_on_its_gpus(vllm_build):
    """The plan gives the response server its GPUs alone: the builder loads the transformers target only after the
    server has written every response and stopped (one start, no target held then)."""
    root, _, _, loaded_at_start = vllm_build
    assert loaded_at_start == [0]
    assert (root / "shards" / "responses.json").is_file()


def test_vllm_written_responses_pass_the_data_checks_and_the_manifest_names_the_engine(vllm_build):
    root, data, manifest, _ = vllm_build
    assert data.checks.passed and data.generated == PROMPTS and data.sequences == manifest["num_sequences"]
    assert data.response_writer == manifest["response_writer"] == "vllm"
    assert manifest["mode"] == "teacher_forced+regenerated"
    # The server is stopped once the build has its last response: nothing answers on its port any more.
    (log,) = (root / "work" / "serving").glob("responses-*.log")
    port = int(re.fullmatch(r"responses-(\d+)\.log", log.name).group(1))
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=2):
        pass


def test_greedy_vllm_responses_equal_the_hugging_face_loops(target, prompts, vllm_build):
    """float32 on CPU at T=0: the same prompt ids, the same responses, EOS kept where a response ended on it."""
    from draftsync.speculative.data.samples import regenerated_samples

    _, model, tokenizer = target
    root, _, manifest, _ = vllm_build
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
    from draftsync.serving.vllm_responses import VllmResponseWriter

    target_dir, _, tokenizer = target
    texts = [prompt for _, prompt in prompts]
    with VllmResponseWriter(target_dir, tmp_path, engine=vllm_engine) as writer:
        full = list(writer.responses(tokenizer, texts, MAX_TOKENS, temperature=1.0, seed=7))
        resumed = list(writer.responses(tokenizer, texts[20:], MAX_TOKENS, temperature=1.0, seed=7, first=20))
        greedy = list(writer.responses(tokenizer, texts[:20], MAX_TOKENS))
        reseeded = list(writer.responses(tokenizer, texts, MAX_TOKENS, temperature=1.0, seed=8))
    assert resumed == full[20:]
    assert greedy != full[:20] and reseeded != full  # it did sample, and another seed samples otherwise
