"""The EAGLE-1 drafter: vLLM's layout, its computation, its loss, and its checkpoint."""

from __future__ import annotations

import json

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.draft_vocab import build_draft_vocab
from draftsync.speculative.data.hidden_states import capture
from draftsync.speculative.methods.checkpoint_files import SavedFor
from draftsync.speculative.methods.eagle1.checkpoint import load_eagle, save_eagle
from draftsync.speculative.methods.eagle1.model import EagleConfig, EagleDrafter
from safetensors.torch import load_file

VOCAB = 384  # the tiny targets' vocabulary (conftest)
HIDDEN = 64

# What vLLM's EagleLlamaForCausalLM accepts from a checkpoint (names without the `model.` prefix it adds).
VLLM_WEIGHTS = {
    "fc.weight": (HIDDEN, 2 * HIDDEN),
    "layers.0.self_attn.q_proj.weight": (HIDDEN, HIDDEN),
    "layers.0.self_attn.k_proj.weight": (HIDDEN, HIDDEN),
    "layers.0.self_attn.v_proj.weight": (HIDDEN, HIDDEN),
    "layers.0.self_attn.o_proj.weight": (HIDDEN, HIDDEN),
    "layers.0.mlp.gate_proj.weight": (128, HIDDEN),
    "layers.0.mlp.up_proj.weight": (128, HIDDEN),
    "layers.0.mlp.down_proj.weight": (HIDDEN, 128),
    "layers.0.post_attention_layernorm.weight": (HIDDEN,),
}
TARGET_COPIES = {"embed_tokens.weight": (VOCAB, HIDDEN), "lm_head.weight": (VOCAB, HIDDEN)}


def eagle_for(target, seed=0):
    torch.manual_seed(seed)
    drafter = EagleDrafter(EagleConfig.for_target(target.config))
    drafter.initialise_from_target(target)
    return drafter


def perturbed(drafter):
    """Non-trivial norm weights, so that a misplaced or missing norm shows."""
    with torch.no_grad():
        for parameter in drafter.layers.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(2)))
    return drafter


@pytest.fixture(scope="module")
def chain_batch(target, make_chains, make_training_batch):
    ids = torch.tensor(make_chains(8, 24, seed=4))
    mask = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) > 0.2
    return make_training_batch(target, ids, mask, aux=False)


# ---- layout ----------------------------------------------------------------------------------------
def test_parameters_are_vllms_eagle_layer_plus_the_targets_embedding_and_head(random_target):
    drafter = eagle_for(random_target)
    state = {name: tuple(t.shape) for name, t in drafter.state_dict().items()}
    assert state == {**VLLM_WEIGHTS, **TARGET_COPIES}
    assert drafter.method == "eagle" and drafter.target_states == "final"
    assert drafter.config.draft_vocab_size == VOCAB and drafter.d2t is None
    assert torch.equal(drafter.draft_token_ids, torch.arange(VOCAB))


def test_the_target_embedding_and_head_are_frozen_copies(target):
    drafter = eagle_for(target)
    assert torch.equal(drafter.embed_tokens.weight, target.model.embed_tokens.weight)
    assert torch.equal(drafter.lm_head.weight, target.lm_head.weight)
    assert not drafter.embed_tokens.weight.requires_grad and not drafter.lm_head.weight.requires_grad
    with pytest.raises(DraftsyncError, match="freeze_embeddings"):
        drafter.initialise_from_target(target, freeze_embeddings=False)


def test_vocabulary_is_always_the_targets_whole_one(random_target):
    with pytest.raises(DraftsyncError, match="draft_vocab_size"):
        EagleConfig(**{**EagleConfig.for_target(random_target.config).to_dict(), "draft_vocab_size": 100})
    drafter = eagle_for(random_target)
    drafter.set_draft_vocab(None, None)
    with pytest.raises(DraftsyncError, match="whole vocabulary"):
        drafter.set_draft_vocab(*build_draft_vocab(torch.arange(VOCAB, 0, -1), 100))


# ---- computation -----------------------------------------------------------------------------------
def _llama_layer_without_input_norm(drafter):
    """transformers' own Llama decoder layer with the drafter's weights and vLLM's identity input norm."""
    from draftsync.speculative.methods.eagle3.checkpoint import transformer_layer_config
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    config = LlamaConfig(**transformer_layer_config(drafter))
    config._attn_implementation = "eager"
    layer = LlamaDecoderLayer(config, 0).eval()
    layer.input_layernorm = torch.nn.Identity()
    own = {name[len("layers.0.") :]: t for name, t in drafter.state_dict().items() if name.startswith("layers.0.")}
    layer.load_state_dict(own, strict=True)
    return layer, LlamaRotaryEmbedding(config)


def test_forward_is_fc_then_a_llama_layer_without_input_norm_read_by_the_targets_head(target):
    drafter = perturbed(eagle_for(target))
    ids = torch.randint(0, VOCAB, (1, 10), generator=torch.Generator().manual_seed(3))
    states = capture(target, ids, (1, 2, 3))
    layer, rope = _llama_layer_without_input_norm(drafter)
    with torch.no_grad():
        logits, feedback = drafter(ids[:, 1:], drafter.fuse(states.final[:, :-1]), torch.arange(9))
        x = torch.cat([target.model.embed_tokens(ids[:, 1:]), states.final[:, :-1]], -1) @ drafter.fc.weight.T
        mask = torch.full((9, 9), float("-inf")).triu(1)[None, None]
        expected = layer(x, attention_mask=mask, position_embeddings=rope(x, torch.arange(9)[None]))
        expected = expected[0] if isinstance(expected, tuple) else expected
    assert torch.allclose(feedback, expected, atol=1e-5)  # no final norm: the layer output is fed back
    assert torch.allclose(logits, target.lm_head(expected), atol=1e-5)  # and read by the target's head


def test_fuse_passes_the_final_state_through():
    config = EagleConfig(
        hidden_size=8,
        target_hidden_size=8,
        vocab_size=16,
        draft_vocab_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        intermediate_size=16,
    )
    drafter = EagleDrafter(config)
    final = torch.randn(1, 3, 8)
    assert torch.equal(drafter.fuse(final), final)
    assert drafter.to(torch.bfloat16).fuse(final).dtype == torch.bfloat16


# ---- loss ------------------------------------------------------------------------------------------
def test_loss_is_feature_regression_plus_weighted_token_cross_entropy(target, chain_batch):
    """Written out row by row: step s at row t regresses final[t+s+1] and matches the target at t+s+1."""
    drafter = perturbed(eagle_for(target))
    loss = drafter.training_loss(chain_batch, 2, 0.0, None)
    with torch.no_grad():
        logits_per_step, features_per_step = drafter._chain(chain_batch.ids[:, 1:], chain_batch.final[:, :-1], 2)
    batch_size, length = chain_batch.ids.shape
    for step in range(2):
        regression, cross_entropy, hits = [], [], 0
        for b in range(batch_size):
            for t in range(length - 2 - step):
                if not chain_batch.loss_mask[b, t + step + 2]:
                    continue
                error = features_per_step[step][b, t] - chain_batch.final[b, t + step + 1]
                regression.append(torch.where(error.abs() < 1, 0.5 * error**2, error.abs() - 0.5).mean())
                target_row = chain_batch.target_logits[b, t + step + 1]
                p = torch.softmax(target_row, -1)
                cross_entropy.append(-(p * torch.log_softmax(logits_per_step[step][b, t], -1)).sum())
                hits += int(logits_per_step[step][b, t].argmax() == target_row.argmax())
        expected = 1.0 * torch.stack(regression).mean() + 0.1 * torch.stack(cross_entropy).mean()
        assert loss.position_losses[step] == pytest.approx(expected.item(), rel=1e-5)
        assert loss.position_counts[step] == len(regression) and loss.position_hits[step] == hits
    assert loss.total.item() == pytest.approx(sum(loss.position_losses), rel=1e-5)


def test_loss_falls_and_the_head_learns_the_next_token_on_a_fixed_batch(target, chain_batch):
    drafter = eagle_for(target)
    optimizer = torch.optim.AdamW([p for p in drafter.parameters() if p.requires_grad], lr=3e-3)
    frozen = drafter.lm_head.weight.clone()
    first = None
    for _ in range(25):
        loss = drafter.training_loss(chain_batch, 2, 0.0, None)
        optimizer.zero_grad()
        loss.total.backward()
        optimizer.step()
        first = first or loss
    assert loss.total.item() < 0.5 * first.total.item()
    assert sum(loss.position_hits) > sum(first.position_hits)
    assert torch.equal(drafter.lm_head.weight, frozen)


# ---- checkpoint ------------------------------------------------------------------------------------
def save(drafter, directory, gamma=3):
    return save_eagle(drafter, directory, SavedFor("/models/target-v1", ("LlamaForCausalLM",), gamma))


def test_checkpoint_holds_exactly_what_vllm_loads(target, tmp_path):
    out = save(eagle_for(target), tmp_path / "d")
    weights = load_file(str(out / "model.safetensors"))
    assert {name: tuple(t.shape) for name, t in weights.items()} == VLLM_WEIGHTS
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == dict.fromkeys(VLLM_WEIGHTS, "model.safetensors")  # vLLM reads this file only
    copies = load_file(str(out / "target_embeddings.safetensors"))
    assert {name: tuple(t.shape) for name, t in copies.items()} == TARGET_COPIES


def test_config_is_a_one_layer_llama_config_vllm_maps_to_its_eagle_model(target, tmp_path):
    from transformers import AutoConfig

    out = save(eagle_for(target), tmp_path / "d", gamma=4)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"], config["vocab_size"]) == (1, 64, VOCAB)
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (4, 4, 16)
    assert config["intermediate_size"] == 128 and config["hidden_act"] == "silu"
    assert config["max_position_embeddings"] == target.config.max_position_embeddings
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"]
    assert config["draftsync_drafter"] == "eagle" and config["draftsync_speculative_tokens"] == 4
    assert config["draftsync_verifier"] == {"name_or_path": "/models/target-v1", "architectures": ["LlamaForCausalLM"]}
    loaded = AutoConfig.from_pretrained(str(out))
    assert type(loaded).__name__ == "LlamaConfig" and loaded.architectures == ["LlamaForCausalLM"]


def test_round_trip_gives_the_same_drafts(target, tmp_path, bf16_stored):
    drafter = perturbed(eagle_for(target))
    loaded = load_eagle(save(drafter, tmp_path / "d"))
    reference = bf16_stored(drafter)
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(6))
    final = capture(target, ids, (1, 2, 3)).final
    with torch.no_grad():
        for got, want in zip(
            loaded.unroll(ids[:, 1:], final[:, :-1], 2), reference.unroll(ids[:, 1:], final[:, :-1], 2), strict=True
        ):
            assert torch.allclose(got, want, atol=1e-6)
    assert not loaded.embed_tokens.weight.requires_grad and loaded.config == drafter.config


def test_loading_names_the_damaged_file(target, tmp_path):
    out = save(eagle_for(target), tmp_path / "d")
    (out / "target_embeddings.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(DraftsyncError, match="target_embeddings.safetensors"):
        load_eagle(out)
    out = save(eagle_for(target), tmp_path / "e")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "hidden_size": 32, "head_dim": 8}))
    with pytest.raises(DraftsyncError, match="model.safetensors does not match"):
        load_eagle(out)
    with pytest.raises(DraftsyncError, match="speculative_tokens"):
        save(eagle_for(target), tmp_path / "f", gamma=0)
