"""The EAGLE-3 drafter, hidden-state capture, draft vocabulary and training."""

from __future__ import annotations

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.draft_vocab import build_draft_vocab
from draftsync.speculative.data.hidden_states import capture, crop_kv_cache, default_aux_layer_ids, new_kv_cache
from draftsync.speculative.methods.eagle3.model import Eagle3Config, Eagle3Drafter

VOCAB = 384  # the tiny targets' vocabulary (conftest)

LAYER_NAMES = {
    "embed_tokens.weight": (VOCAB, 64),
    "fc.weight": (64, 192),
    "layers.0.self_attn.q_proj.weight": (64, 128),
    "layers.0.self_attn.k_proj.weight": (64, 128),
    "layers.0.self_attn.v_proj.weight": (64, 128),
    "layers.0.self_attn.o_proj.weight": (64, 64),
    "layers.0.mlp.gate_proj.weight": (128, 64),
    "layers.0.mlp.up_proj.weight": (128, 64),
    "layers.0.mlp.down_proj.weight": (64, 128),
    "layers.0.input_layernorm.weight": (64,),
    "layers.0.post_attention_layernorm.weight": (64,),
    "layers.0.hidden_norm.weight": (64,),
    "norm.weight": (64,),
}


# ---- aux layer ids and capture ---------------------------------------------------------------------
@pytest.mark.parametrize("layers", range(2, 41))
def test_default_aux_layer_ids_are_three_distinct_ids_in_range(layers):
    ids = default_aux_layer_ids(layers)
    assert len(set(ids)) == 3 and all(0 <= k <= layers for k in ids) and list(ids) == sorted(ids)


def test_default_aux_layer_ids_follow_vllm_when_distinct_and_avoid_collisions():
    assert default_aux_layer_ids(32) == (2, 16, 29)
    assert default_aux_layer_ids(4) == (1, 2, 3)  # vLLM's (2, 2, 1) would collide
    with pytest.raises(DraftsyncError):
        default_aux_layer_ids(1)


def test_capture_takes_the_residual_stream_after_k_layers(random_target):
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
    states = capture(random_target, ids, (0, 1, 3))
    with torch.no_grad():
        reference = random_target(input_ids=ids, output_hidden_states=True)
        from_last = random_target.lm_head(random_target.model.norm(states.last))
    hidden = reference.hidden_states  # entries 0..L-1 are the inputs of layers 0..L-1
    assert torch.equal(states.aux, torch.cat([hidden[0], hidden[1], hidden[3]], dim=-1))
    assert torch.allclose(states.logits, reference.logits)
    assert torch.allclose(from_last, reference.logits, atol=1e-5)  # `last` is pre-norm
    assert torch.equal(capture(random_target, ids, (1, 2, 4)).aux[..., 128:], states.last)


def test_capture_with_a_kv_cache_gives_the_states_of_new_tokens(random_target):
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    full = capture(random_target, ids, (1, 2, 3))
    cache = new_kv_cache(random_target)
    first = capture(random_target, ids[:, :7], (1, 2, 3), cache=cache)
    capture(random_target, ids[:, 7:10], (1, 2, 3), cache=cache)
    crop_kv_cache(cache, 3)  # take back the last three, as after a rejected draft
    second = capture(random_target, ids[:, 7:], (1, 2, 3), cache=cache)
    stepwise = torch.cat([first.aux, second.aux], dim=1)
    assert torch.allclose(stepwise, full.aux, atol=1e-5)
    assert torch.allclose(second.logits, full.logits[:, 7:], atol=1e-5)


# ---- the drafter -----------------------------------------------------------------------------------
def drafter_for(target, draft_vocab_size=None, **flags):
    torch.manual_seed(0)
    return Eagle3Drafter(Eagle3Config.for_target(target.config, draft_vocab_size, **flags)).eval()


def test_parameter_and_buffer_names_are_the_speculators_ones(random_target):
    state = {name: tuple(t.shape) for name, t in drafter_for(random_target, 100).state_dict().items()}
    assert state == {**LAYER_NAMES, "lm_head.weight": (100, 64), "d2t": (100,), "t2d": (VOCAB,)}
    drafter = drafter_for(random_target, 100)
    assert drafter.d2t.dtype == torch.int64 and drafter.t2d.dtype == torch.bool


def test_full_vocabulary_head_has_no_mapping_buffers(random_target):
    state = {name: tuple(t.shape) for name, t in drafter_for(random_target).state_dict().items()}
    assert state == {**LAYER_NAMES, "lm_head.weight": (VOCAB, 64)}


def test_norm_flags_add_their_weights(random_target):
    eagle31 = drafter_for(random_target, fc_norm=True, norm_output=True).state_dict()
    assert {"fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"} <= set(eagle31)
    assert tuple(eagle31["fc_norm.0.weight"].shape) == (64,)
    before_fc = drafter_for(random_target, norm_before_fc=True).state_dict()
    assert tuple(before_fc["input_norm.weight"].shape) == (192,)
    with pytest.raises(DraftsyncError, match="fc_norm"):
        Eagle3Config.for_target(random_target.config, fc_norm=True, norm_before_fc=True)
    with pytest.raises(DraftsyncError):
        Eagle3Config.for_target(random_target.config, aux_layer_ids=(1, 1, 2))


def _reference_step(drafter, input_ids, aux, norm_before_residual):
    """The EAGLE-3 draft layer written out op by op, with transformers' own rotary embedding."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    config = drafter.config
    layer = drafter.layers[0]

    def rms(x, weight):
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + config.rms_norm_eps)

    length = input_ids.shape[1]
    hidden = aux @ drafter.fc.weight.T
    embeds = rms(drafter.embed_tokens.weight[input_ids], layer.input_layernorm.weight)
    normed_hidden = rms(hidden, layer.hidden_norm.weight)
    residual = normed_hidden if norm_before_residual else hidden
    x = torch.cat([embeds, normed_hidden], dim=-1)
    attn = layer.self_attn
    heads, dim = config.num_attention_heads, config.head_dim
    q = (x @ attn.q_proj.weight.T).view(1, length, heads, dim).transpose(1, 2)
    k = (x @ attn.k_proj.weight.T).view(1, length, heads, dim).transpose(1, 2)
    v = (x @ attn.v_proj.weight.T).view(1, length, heads, dim).transpose(1, 2)
    rope = LlamaRotaryEmbedding(
        LlamaConfig(
            hidden_size=config.hidden_size, num_attention_heads=heads, head_dim=dim, rope_theta=config.rope_theta
        )
    )
    cos, sin = rope(x, torch.arange(length)[None])
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    scores = (q @ k.transpose(-1, -2)) / dim**0.5
    scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(1, length, heads * dim) @ attn.o_proj.weight.T
    hidden = residual + out
    mlp = layer.mlp
    post = rms(hidden, layer.post_attention_layernorm.weight)
    hidden = (
        hidden
        + (torch.nn.functional.silu(post @ mlp.gate_proj.weight.T) * (post @ mlp.up_proj.weight.T))
        @ mlp.down_proj.weight.T
    )
    return rms(hidden, drafter.norm.weight) @ drafter.lm_head.weight.T, hidden


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_forward_matches_the_eagle3_layer_definition(random_target, norm_before_residual):
    drafter = drafter_for(random_target, 200, norm_before_residual=norm_before_residual)
    with torch.no_grad():
        for parameter in drafter.parameters():  # non-trivial norm weights so that misplaced norms show
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(2)))
    ids = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(3))
    states = capture(random_target, ids, drafter.config.aux_layer_ids)
    with torch.no_grad():
        logits, feedback = drafter(ids[:, 1:], drafter.fuse(states.aux[:, :-1]), torch.arange(9))
        expected_logits, expected_hidden = _reference_step(
            drafter, ids[:, 1:], states.aux[:, :-1], norm_before_residual
        )
    assert torch.allclose(logits, expected_logits, atol=1e-5)
    assert torch.allclose(feedback, expected_hidden, atol=1e-5)  # pre-norm state is fed back


def test_eagle31_feeds_back_the_normalised_state(random_target):
    drafter = drafter_for(random_target, fc_norm=True, norm_output=True)
    aux = torch.randn(1, 5, 192, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        fused = drafter.fc(torch.cat([drafter.fc_norm[i](chunk) for i, chunk in enumerate(aux.chunk(3, -1))], -1))
        assert torch.allclose(drafter.fuse(aux), fused)
        logits, feedback = drafter(torch.arange(5)[None], fused, torch.arange(5))
        assert torch.allclose(drafter.lm_head(feedback), logits, atol=1e-5)


def test_initialise_from_target_copies_embeddings_head_rows_and_norm(target):
    drafter = drafter_for(target, 256)
    d2t, t2d = build_draft_vocab(torch.arange(VOCAB, 0, -1), 256)
    drafter.set_draft_vocab(d2t, t2d)
    drafter.initialise_from_target(target)
    assert torch.equal(drafter.embed_tokens.weight, target.model.embed_tokens.weight)
    assert not drafter.embed_tokens.weight.requires_grad
    assert torch.equal(drafter.lm_head.weight, target.lm_head.weight[:256])
    assert torch.equal(drafter.norm.weight, target.model.norm.weight)


# ---- draft vocabulary ------------------------------------------------------------------------------
def test_draft_vocab_keeps_the_most_frequent_ids_sorted():
    counts = torch.tensor([5, 0, 9, 9, 1, 7, 0, 3])
    d2t, t2d = build_draft_vocab(counts, 4)
    kept = torch.arange(4) + d2t
    assert kept.tolist() == [0, 2, 3, 5]
    assert t2d.tolist() == [True, False, True, True, False, True, False, False]
    assert d2t.dtype == torch.int64 and t2d.dtype == torch.bool
    assert build_draft_vocab(counts, 3)[0].add(torch.arange(3)).tolist() == [2, 3, 5]
    assert build_draft_vocab(counts, 8) == (None, None)
    with pytest.raises(DraftsyncError):
        build_draft_vocab(counts, 9)


def test_capture_can_skip_all_but_the_last_logits_and_final_is_what_lm_head_reads(target):
    ids = torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(4))
    full = capture(target, ids, (1, 2, 3))
    light = capture(target, ids, (1, 2, 3), all_logits=False)
    assert light.logits.shape == (2, 1, VOCAB)
    torch.testing.assert_close(light.logits[:, 0], full.logits[:, -1])
    torch.testing.assert_close(light.aux, full.aux)
    torch.testing.assert_close(target.lm_head(full.final), full.logits, atol=1e-5, rtol=1e-5)
