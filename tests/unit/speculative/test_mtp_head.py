"""The MTP head: vLLM's MiMo MTP computation, the state it reads, its chain, its loss, and lossless decoding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.hidden_states import capture, new_kv_cache
from draftsync.speculative.data.training_batch import TrainingBatch
from draftsync.speculative.engine.decoding import SpeculativeEngine
from draftsync.speculative.methods import METHODS, TRAINED_METHODS
from draftsync.speculative.methods.eagle3.model import DrafterKVCache
from draftsync.speculative.methods.mtp.model import MtpHead
from draftsync.speculative.methods.registry import make_proposer, new_drafter, parameter_count
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB = 128
HIDDEN = 64
LAYERS = 2


def qwen2_config(layers: int = LAYERS, hidden: int = HIDDEN) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )


def qwen2_target(seed: int = 0, layers: int = LAYERS) -> Qwen2ForCausalLM:
    """A tiny random Qwen2 (hidden 64, vocab 128, grouped-query attention, q/k/v biases)."""
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(qwen2_config(layers)).eval()
    with torch.no_grad():  # non-zero biases and norms, so that a missing one shows
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.add_(0.1 * torch.randn(parameter.shape))
    return model


def chain_qwen2_target(seed: int = 1) -> tuple[Qwen2ForCausalLM, torch.Tensor]:
    """A tiny Qwen2 that mostly predicts successor[x] after x: its head reads the token's embedding back out of the
    residual stream through a permutation. Returns it with the permutation."""
    model = qwen2_target(seed)
    successor = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        embed.normal_(0.0, 1.0, generator=torch.Generator().manual_seed(seed))
        model.lm_head.weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(seed + 1))
        model.lm_head.weight[successor] = 8.0 * embed / HIDDEN
        model.model.norm.weight.fill_(1.0)
    return model, successor


def mtp_for(target, seed: int = 0) -> MtpHead:
    """A random MTP head for `target` with non-trivial norms and biases."""
    torch.manual_seed(seed)
    head = new_drafter("mtp", target.config)
    head.initialise_from_target(target)
    with torch.no_grad():
        for name, parameter in head.model.mtp_layers.named_parameters():
            if name.endswith("bias") or "norm" in name:
                parameter.add_(0.2 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(seed + 3)))
    return head.eval()


@pytest.fixture(scope="module")
def target():
    return qwen2_target()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(3))


# ---- what it is ------------------------------------------------------------------------------------
def test_the_method_is_a_chained_full_vocabulary_method_no_sync_trains_yet():
    method = METHODS["mtp"]
    assert (method.family, method.vllm_method, method.chains, method.full_vocabulary) == ("mtp", "mtp", True, True)
    assert method.reads_aux_states and not method.trained and "mtp" not in TRAINED_METHODS


def test_it_reads_the_targets_last_layer_and_holds_vllms_tensor_names(target):
    head = mtp_for(target)
    assert (head.method, head.target_states, head.aux_layer_ids) == ("mtp", "aux", (LAYERS,))
    layer = "model.mtp_layers.0."
    assert {name: tuple(t.shape) for name, t in head.state_dict().items()} == {
        "model.embed_tokens.weight": (VOCAB, HIDDEN),
        "lm_head.weight": (VOCAB, HIDDEN),
        layer + "token_layernorm.weight": (HIDDEN,),
        layer + "hidden_layernorm.weight": (HIDDEN,),
        layer + "input_proj.weight": (HIDDEN, 2 * HIDDEN),
        layer + "input_layernorm.weight": (HIDDEN,),
        layer + "self_attn.q_proj.weight": (HIDDEN, HIDDEN),
        layer + "self_attn.q_proj.bias": (HIDDEN,),
        layer + "self_attn.k_proj.weight": (32, HIDDEN),
        layer + "self_attn.k_proj.bias": (32,),
        layer + "self_attn.v_proj.weight": (32, HIDDEN),
        layer + "self_attn.v_proj.bias": (32,),
        layer + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
        layer + "post_attention_layernorm.weight": (HIDDEN,),
        layer + "mlp.gate_proj.weight": (128, HIDDEN),
        layer + "mlp.up_proj.weight": (128, HIDDEN),
        layer + "mlp.down_proj.weight": (HIDDEN, 128),
        layer + "final_layernorm.weight": (HIDDEN,),
    }
    assert torch.equal(head.model.embed_tokens.weight, target.model.embed_tokens.weight)
    assert torch.equal(head.lm_head.weight, target.lm_head.weight)
    assert not head.model.embed_tokens.weight.requires_grad and not head.lm_head.weight.requires_grad
    assert parameter_count(head).own == parameter_count(head).total - 2 * VOCAB * HIDDEN
    assert head.d2t is None and torch.equal(head.draft_token_ids, torch.arange(VOCAB))


def test_what_does_not_fit_an_mtp_head_is_refused(target):
    with pytest.raises(DraftsyncError, match="draft vocabulary of 100"):
        new_drafter("mtp", target.config, 100)
    with pytest.raises(DraftsyncError, match=f"reads layer {LAYERS} alone") as error:
        new_drafter("mtp", target.config, aux_layer_ids=(0, 1, 2))
    assert f"[{LAYERS}]" in error.value.fix
    assert new_drafter("mtp", target.config, aux_layer_ids=(LAYERS,)).aux_layer_ids == (LAYERS,)
    head = mtp_for(target)
    with pytest.raises(DraftsyncError, match="whole vocabulary"):
        head.set_draft_vocab(torch.arange(10), torch.ones(VOCAB, dtype=torch.bool))
    with pytest.raises(DraftsyncError, match="freeze_embeddings"):
        head.initialise_from_target(target, freeze_embeddings=False)
    gelu = qwen2_config()
    gelu.hidden_act = "gelu"
    with pytest.raises(DraftsyncError, match="silu"):
        new_drafter("mtp", gelu)


# ---- computation -----------------------------------------------------------------------------------
def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding of x [B, heads, T, d] at `positions` [T], from its definition."""
    d = x.shape[-1]
    frequencies = theta ** (-torch.arange(0, d, 2).float() / d)
    angles = positions.float()[:, None] * frequencies[None, :]
    cos, sin = angles.cos().repeat(1, 2), angles.sin().repeat(1, 2)
    rotated = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def vllm_mtp_formula(head: MtpHead, config: Qwen2Config, embed, lm_head, state, next_ids, positions):
    """vLLM's MiMo MTP step written out: zero the embedding at position 0, token/hidden norms, input_proj over
    (hidden ++ embedding), one Qwen2 layer with its residuals, final_layernorm, the target's lm_head."""
    p = {name[len("model.mtp_layers.0.") :]: t for name, t in head.state_dict().items() if "mtp_layers" in name}
    eps, heads, kv_heads = config.rms_norm_eps, config.num_attention_heads, config.num_key_value_heads
    d = config.hidden_size // heads
    batch, length, _ = state.shape
    embeds = embed[next_ids] * (positions != 0).float()[None, :, None]
    x = torch.cat([_rms(state, p["hidden_layernorm.weight"], eps), _rms(embeds, p["token_layernorm.weight"], eps)], -1)
    x = x @ p["input_proj.weight"].T
    a = _rms(x, p["input_layernorm.weight"], eps)

    def project(name, count):
        out = a @ p[f"self_attn.{name}_proj.weight"].T + p[f"self_attn.{name}_proj.bias"]
        return out.view(batch, length, count, d).transpose(1, 2)

    theta = config.rope_parameters["rope_theta"]
    q = _rotary(project("q", heads), positions, theta)
    k = _rotary(project("k", kv_heads), positions, theta).repeat_interleave(heads // kv_heads, 1)
    v = project("v", kv_heads).repeat_interleave(heads // kv_heads, 1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, heads * d)
    x = x + attended @ p["self_attn.o_proj.weight"].T
    m = _rms(x, p["post_attention_layernorm.weight"], eps)
    x = x + (F.silu(m @ p["mlp.gate_proj.weight"].T) * (m @ p["mlp.up_proj.weight"].T)) @ p["mlp.down_proj.weight"].T
    out = _rms(x, p["final_layernorm.weight"], eps)
    return out @ lm_head.T, out


def test_step_zero_is_vllms_mimo_mtp_formula_over_the_pre_norm_state(target, ids):
    """Row t: the target's pre-norm state at t, token t+1, position t; the position-0 embedding is zeroed."""
    head = mtp_for(target)
    states = capture(target, ids, head.aux_layer_ids)
    with torch.no_grad():
        unrolled = head.unroll(ids[:, 1:], states.aux[:, :-1], 2)[0]
        logits, out = head(ids[:, 1:], head.fuse(states.aux[:, :-1]), torch.arange(11))
        expected, expected_out = vllm_mtp_formula(
            head,
            target.config,
            target.model.embed_tokens.weight,
            target.lm_head.weight,
            states.last[:, :-1],
            ids[:, 1:],
            torch.arange(11),
        )
    assert torch.allclose(unrolled, expected, atol=1e-5)
    assert torch.allclose(logits, expected, atol=1e-5) and torch.allclose(out, expected_out, atol=1e-5)


def test_the_position_zero_embedding_is_masked_and_only_there(target, ids):
    head = mtp_for(target)
    states = capture(target, ids, head.aux_layer_ids)
    hidden = head.fuse(states.aux[:, :-1])
    other = ids[:, 1:].clone()
    other[:, 0] = (other[:, 0] + 1) % VOCAB  # another token where the position is 0
    with torch.no_grad():
        first, _ = head(ids[:, 1:], hidden, torch.arange(11))
        changed, _ = head(other, hidden, torch.arange(11))
        shifted, _ = head(other, hidden, torch.arange(1, 12))  # the same rows one position on: read
    assert torch.equal(first, changed)
    assert not torch.allclose(first[:, 0], shifted[:, 0])


def test_the_layer_is_transformers_own_qwen2_decoder_layer(target, ids):
    """An independent implementation of the layer between input_proj and final_layernorm."""
    from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer, Qwen2RotaryEmbedding

    head = mtp_for(target)
    config = qwen2_config()
    config._attn_implementation = "eager"
    layer = Qwen2DecoderLayer(config, 0).eval()
    own = {
        name[len("model.mtp_layers.0.") :]: t
        for name, t in head.state_dict().items()
        if "mtp_layers" in name and not name.split(".")[3].startswith(("token_", "hidden_", "input_proj", "final_"))
    }
    layer.load_state_dict(own, strict=True)
    x = torch.randn(2, 11, HIDDEN, generator=torch.Generator().manual_seed(8))
    positions = torch.arange(3, 14)
    mask = torch.full((11, 11), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        expected = layer(x, attention_mask=mask, position_embeddings=Qwen2RotaryEmbedding(config)(x, positions[None]))
        expected = expected[0] if isinstance(expected, tuple) else expected
        mine = head.layer
        attn, _, _ = mine.self_attn(
            mine.input_layernorm(x), head._rope(positions, x.dtype), None, torch.ones(11, 11).tril().bool()
        )
        residual = x + attn
        got = residual + mine.mlp(mine.post_attention_layernorm(residual))
    assert torch.allclose(got, expected, atol=1e-5)


def test_draft_chain_with_cache_equals_the_training_time_test_unroll(target, ids):
    """The engine's chained steps (KV cache, cropped) along an accepted chain see what training-time test trains:
    step s at row t feeds back step s-1's output with token t+s+1 at position t+s."""
    head = mtp_for(target)
    states = capture(target, ids[:1], head.aux_layer_ids)
    with torch.no_grad():
        unrolled = head.unroll(ids[:1, 1:], states.aux[:, :-1], 3)
        cache = DrafterKVCache()
        logits, hidden = head(ids[:1, 1:], head.fuse(states.aux[:, :-1]), torch.arange(11), cache)
        assert torch.allclose(logits, unrolled[0], atol=1e-5)
        cache.crop(1)
        for row in range(11):
            fed = hidden[:, row : row + 1]
            for step in (1, 2):
                if row + step + 1 > 11:  # the real token fed at this step lies beyond the sequence
                    break
                position = torch.tensor([row + step])
                step_logits, fed = head(ids[:1, row + step + 1 : row + step + 2], fed, position, cache)
                assert torch.allclose(step_logits[0, 0], unrolled[step][0, row], atol=1e-5), (row, step)
            cache.crop(row + 1)  # the proposals go; the next real position is verified and run
            if row + 1 < 11:
                head(
                    ids[:1, row + 2 : row + 3],
                    head.fuse(states.aux[:, row + 1 : row + 2]),
                    torch.tensor([row + 1]),
                    cache,
                )


# ---- the state the engine gives it -----------------------------------------------------------------
def test_the_engine_hands_it_the_targets_pre_norm_last_state(target, ids):
    head = mtp_for(target)
    engine = SpeculativeEngine(target, head, 2)
    assert engine.target_states == "aux" and engine.layer_ids == (LAYERS,)
    seen = {}
    handle = target.model.norm.register_forward_pre_hook(lambda _m, args: seen.update(state=args[0]))
    try:
        logits, states = engine._target_step(ids[0].tolist(), new_kv_cache(target))
    finally:
        handle.remove()
    assert torch.allclose(states, seen["state"][0]) and not torch.allclose(states, target.model.norm(states))
    assert torch.allclose(logits, target.lm_head(target.model.norm(states)).float(), atol=1e-5)


def test_a_target_of_another_depth_or_width_is_refused(target):
    head = mtp_for(target)
    with pytest.raises(DraftsyncError, match="built for a target of 2 layers"):
        SpeculativeEngine(qwen2_target(layers=3), head, 2)
    wide = Qwen2ForCausalLM(qwen2_config(hidden=96)).eval()
    with pytest.raises(DraftsyncError, match="hidden size 64"):
        make_proposer(head).check_target(wide)


# ---- lossless decoding -----------------------------------------------------------------------------
@pytest.mark.parametrize("gamma", [1, 3])
def test_greedy_speculative_decoding_with_a_random_head_is_plain_greedy_decoding(target, gamma):
    prompt = [5, 17, 3, 99, 42, 8]
    plain = SpeculativeEngine(target, None, 0).generate(prompt, 40)
    speculative = SpeculativeEngine(target, mtp_for(target), gamma).generate(prompt, 40)
    assert speculative.token_ids == plain.token_ids
    assert speculative.stats.drafts > 0


def test_greedy_decoding_stays_lossless_when_drafts_are_accepted():
    """A head that reads the next token's embedding straight out agrees with a successor-chain target, but for a few
    tokens of the text whose head rows it has swapped: drafts accepted and rejected mid-chain exercise the caches'
    crops, and the output is still the target's greedy text."""
    chain, successor = chain_qwen2_target()
    prompt = [3, int(successor[3]), int(successor[successor[3]])]
    plain = SpeculativeEngine(chain, None, 0).generate(prompt, 60)
    head = new_drafter("mtp", chain.config)
    head.initialise_from_target(chain)
    with torch.no_grad():
        layer = head.layer
        layer.input_proj.weight.zero_()
        layer.input_proj.weight[:, HIDDEN:] = torch.eye(HIDDEN)  # the embedding half only
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        wrong = torch.tensor(sorted(set(plain.token_ids[8::13])))  # each drafted as another one
        head.lm_head.weight[wrong] = head.lm_head.weight[wrong.roll(1)].clone()
    speculative = SpeculativeEngine(chain, head, 3).generate(prompt, 60)
    assert speculative.token_ids == plain.token_ids
    stats = speculative.stats
    assert 0 < stats.accepted < stats.draft_tokens and stats.accepted_per_position[2] > 0, stats


# ---- training --------------------------------------------------------------------------------------
def _batch(target, ids, layer_ids=(LAYERS,)) -> TrainingBatch:
    states = capture(target, ids, layer_ids)
    mask = torch.ones_like(ids, dtype=torch.bool)
    return TrainingBatch(
        ids=ids,
        valid=mask,
        loss_mask=mask,
        aux=states.aux.float(),
        final=states.final.float(),
        target_logits=states.logits.float(),
    )


def test_the_loss_is_soft_cross_entropy_of_each_chained_step_and_nothing_else(target, ids):
    head = mtp_for(target)
    batch = _batch(target, ids)
    loss = head.training_loss(batch, 2)
    with torch.no_grad():
        unrolled = head.unroll(ids[:, 1:], batch.aux[:, :-1], 2)
    length = ids.shape[1]
    for step in range(2):
        rows = length - step - 2  # row t of step s predicts token t+s+2, inside the window
        p = torch.softmax(batch.target_logits[:, step + 1 : step + 1 + rows], -1)
        expected = -(p * torch.log_softmax(unrolled[step][:, :rows], -1)).sum(-1).mean()
        assert loss.position_losses[step] == pytest.approx(float(expected), rel=1e-5)
        assert loss.position_counts[step] == 2 * rows
    assert float(loss.total.detach()) == pytest.approx(sum(loss.position_losses), rel=1e-5)
    assert [step for step, _ in loss.chain_terms] == [0, 1]


def test_a_few_training_steps_lower_the_loss(ids):
    """On a target with a peaked distribution (a random one's is nearly uniform: nothing to learn)."""
    chain, _ = chain_qwen2_target()
    head = mtp_for(chain).train()
    batch = _batch(chain, ids)
    optimiser = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=1e-2)
    before = float(head.training_loss(batch, 2).total.detach())
    for _ in range(10):
        optimiser.zero_grad()
        head.training_loss(batch, 2).total.backward()
        optimiser.step()
    after = float(head.training_loss(batch, 2).total.detach())
    assert after < 0.8 * before, (before, after)
    assert torch.equal(head.lm_head.weight, chain.lm_head.weight)  # the frozen copies stay the target's
    assert torch.equal(head.model.embed_tokens.weight, chain.model.embed_tokens.weight)


def test_a_batch_without_layer_ls_state_alone_is_refused(target, ids):
    head = mtp_for(target)
    with pytest.raises(DraftsyncError, match=f"aux_layer_ids \\[{LAYERS}\\]"):
        head.training_loss(_batch(target, ids, layer_ids=(0, 1, 2)), 1)
    batch = _batch(target, ids)
    batch.aux = None
    with pytest.raises(DraftsyncError, match="no aux states"):
        head.training_loss(batch, 1)


def test_activation_checkpointing_recomputes_the_same_gradients(target, ids):
    batch = _batch(target, ids)
    gradients = []
    for recompute in (False, True):
        head = mtp_for(target).train()
        head.activation_checkpointing = recompute
        head.training_loss(batch, 2).total.backward()
        gradients.append(head.layer.input_proj.weight.grad.clone())
    assert torch.allclose(gradients[0], gradients[1], atol=1e-6)
