"""The Medusa drafter: heads, loss alignment, training, and its checkpoint format (vLLM's Medusa layout)."""

from __future__ import annotations

import json

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.data.draft_vocab import build_draft_vocab
from draftsync.speculative.data.hidden_states import capture
from draftsync.speculative.data.training_batch import TrainingBatch
from draftsync.speculative.engine.decoding import SpeculativeEngine
from draftsync.speculative.methods.checkpoint_files import SavedFor
from draftsync.speculative.methods.medusa.checkpoint import load_medusa, save_medusa
from draftsync.speculative.methods.medusa.model import MedusaConfig, MedusaDrafter
from draftsync.speculative.methods.registry import load_drafter
from safetensors.torch import load_file, save_file

from tests.support.greedy import greedy_reference

VOCAB = 384  # the tiny targets' vocabulary (conftest)
HIDDEN = 64


def medusa_for(target, draft_vocab_size=None, num_heads=3, num_layers=1, seed=0):
    torch.manual_seed(seed)
    drafter = MedusaDrafter(
        MedusaConfig.for_target(target.config, draft_vocab_size, num_heads=num_heads, num_layers=num_layers)
    )
    if draft_vocab_size is not None and draft_vocab_size < VOCAB:
        drafter.set_draft_vocab(*build_draft_vocab(torch.arange(VOCAB, 0, -1), draft_vocab_size))
    drafter.initialise_from_target(target)
    return drafter


def perturbed(drafter):
    generator = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for block in drafter.blocks:
            for layer in block.layers:
                layer.weight.normal_(0.0, 0.05, generator=generator)
                layer.bias.normal_(0.0, 0.05, generator=generator)
    return drafter


@pytest.fixture(scope="module")
def chain_batch(target, make_chains, make_training_batch):
    ids = torch.tensor(make_chains(8, 24, seed=5))
    mask = torch.rand(ids.shape, generator=torch.Generator().manual_seed(1)) > 0.2
    return make_training_batch(target, ids, mask, aux=False)


# ---- layout and heads ------------------------------------------------------------------------------
def test_names_follow_vllms_medusa_model_with_the_eagle3_vocabulary_buffers(random_target):
    drafter = medusa_for(random_target, 200, num_heads=2, num_layers=2)
    state = {name: tuple(t.shape) for name, t in drafter.state_dict().items()}
    blocks = {
        f"blocks.{k}.layers.{j}.{kind}": (HIDDEN, HIDDEN) if kind == "weight" else (HIDDEN,)
        for k in range(2)
        for j in range(2)
        for kind in ("weight", "bias")
    }
    assert state == {
        **blocks,
        "lm_heads.0.weight": (200, HIDDEN),
        "lm_heads.1.weight": (200, HIDDEN),
        "d2t": (200,),
        "t2d": (VOCAB,),
    }
    full = {name for name in medusa_for(random_target).state_dict()}
    assert "d2t" not in full and "t2d" not in full
    assert drafter.method == "medusa" and drafter.target_states == "final"
    assert drafter.config.target_hidden_size == HIDDEN


def test_fresh_heads_are_the_target_head_on_the_draft_vocabulary(target):
    """Blocks start as the identity and every lm_head as the target's rows: each head repeats the target."""
    drafter = medusa_for(target, 256)
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    states = capture(target, ids, (1, 2, 3))
    with torch.no_grad():
        logits = drafter.heads(states.final)
    assert logits.shape == (2, 7, 3, 256)
    for k in range(3):
        assert torch.allclose(logits[:, :, k], states.logits[..., drafter.draft_token_ids], atol=1e-5)


def test_each_head_is_residual_silu_blocks_with_bias_then_its_own_head(random_target):
    drafter = perturbed(medusa_for(random_target, num_heads=2, num_layers=2))
    final = torch.randn(1, 4, HIDDEN, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        logits = drafter.heads(final)
        for k in range(2):
            x = final
            for layer in drafter.blocks[k].layers:
                x = x + torch.nn.functional.silu(x @ layer.weight.T + layer.bias)
            assert torch.allclose(logits[:, :, k], x @ drafter.lm_heads[k].weight.T, atol=1e-5)


def test_config_is_checked():
    with pytest.raises(DraftsyncError, match="proposes nothing"):
        MedusaConfig(hidden_size=8, vocab_size=16, draft_vocab_size=16, num_heads=0)
    with pytest.raises(DraftsyncError, match="draft vocabulary"):
        MedusaConfig(hidden_size=8, vocab_size=16, draft_vocab_size=17)


# ---- loss ------------------------------------------------------------------------------------------
def test_head_k_at_row_t_learns_the_target_distribution_over_token_t_plus_2_plus_k(target, chain_batch):
    drafter = perturbed(medusa_for(target, 200))
    loss = drafter.training_loss(chain_batch, 1, 0.0, None)
    with torch.no_grad():
        logits = drafter.heads(chain_batch.final)
    draft_ids = drafter.draft_token_ids
    batch_size, length = chain_batch.ids.shape
    expected_total = 0.0
    for k in range(3):
        terms, hits = [], 0
        for b in range(batch_size):
            for t in range(length - 2 - k):
                if not chain_batch.loss_mask[b, t + 2 + k]:
                    continue
                target_row = chain_batch.target_logits[b, t + 1 + k]
                p = torch.softmax(target_row[draft_ids], -1)
                terms.append(-(p * torch.log_softmax(logits[b, t, k], -1)).sum())
                hits += int(draft_ids[logits[b, t, k].argmax()] == target_row.argmax())
        head_loss = torch.stack(terms).mean().item()
        assert loss.position_losses[k] == pytest.approx(head_loss, rel=1e-5)
        assert loss.position_counts[k] == len(terms) and loss.position_hits[k] == hits
        expected_total += 0.8**k * head_loss
    assert loss.total.item() == pytest.approx(expected_total, rel=1e-5)


def test_loss_falls_and_later_heads_learn_to_look_ahead(target, chain_batch):
    drafter = medusa_for(target, 256)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    first = None
    for _ in range(40):
        loss = drafter.training_loss(chain_batch, 1, 0.0, None)
        optimizer.zero_grad()
        loss.total.backward()
        optimizer.step()
        first = first or loss
    assert loss.total.item() < 0.7 * first.total.item()
    assert loss.position_hits[1] > first.position_hits[1]  # head 1 starts by repeating the next token


def test_heads_without_a_target_in_a_short_window_count_nothing(target, chain_batch):
    drafter = medusa_for(target, num_heads=4)
    short = TrainingBatch(
        *(
            None if t is None else t[:, :4]
            for t in (
                chain_batch.ids,
                chain_batch.valid,
                chain_batch.loss_mask,
                chain_batch.aux,
                chain_batch.final,
                chain_batch.target_logits,
            )
        )
    )
    loss = drafter.training_loss(short, 1, 0.0, None)
    assert loss.position_counts[2:] == [0, 0] and loss.position_losses[2:] == [0.0, 0.0]
    assert loss.position_counts[0] > 0 and loss.total.requires_grad


# ---- checkpoint ------------------------------------------------------------------------------------
def save(drafter, directory, gamma=3):
    return save_medusa(drafter, directory, SavedFor("/models/target-v1", ("LlamaForCausalLM",), gamma))


def test_config_is_vllms_medusa_config_with_our_fields(target, tmp_path):
    config = json.loads(
        (save(medusa_for(target, 200, num_layers=2), tmp_path / "d", gamma=2) / "config.json").read_text()
    )
    assert config == {
        "draftsync_drafter": "medusa",
        "architectures": ["MedusaModel"],
        "model_type": "medusa",
        "hidden_size": HIDDEN,
        "vocab_size": VOCAB,
        "num_heads": 3,
        "num_hidden_layers": 2,
        "truncated_vocab_size": VOCAB,
        "medusa_fc_bias": True,
        "draft_vocab_size": 200,
        "loss_decay": 0.8,
        "speculative_tokens": 2,
        "verifier": {"name_or_path": "/models/target-v1", "architectures": ["LlamaForCausalLM"]},
        "torch_dtype": "bfloat16",
    }


def test_weights_are_bf16_heads_over_the_whole_vocabulary(target, tmp_path):
    """Each trained row sits at its target id; the rows outside the draft vocabulary are the rows' mean."""
    drafter = perturbed(medusa_for(target, 200, num_layers=2))
    tensors = load_file(str(save(drafter, tmp_path / "d") / "model.safetensors"))
    blocks = {
        f"blocks.{k}.layers.{j}.{kind}": (HIDDEN, HIDDEN) if kind == "weight" else (HIDDEN,)
        for k in range(3)
        for j in range(2)
        for kind in ("weight", "bias")
    }
    heads = {f"lm_heads.{k}.weight": (VOCAB, HIDDEN) for k in range(3)}
    assert {name: tuple(t.shape) for name, t in tensors.items()} == {**blocks, **heads, "d2t": (200,), "t2d": (VOCAB,)}
    assert tensors["lm_heads.2.weight"].dtype == tensors["blocks.0.layers.1.bias"].dtype == torch.bfloat16
    assert torch.equal(tensors["t2d"], drafter.t2d) and tensors["d2t"].dtype == torch.int64
    draft_ids = drafter.draft_token_ids
    for k in range(3):
        head = tensors[f"lm_heads.{k}.weight"]
        rows = drafter.lm_heads[k].weight.detach().to(torch.bfloat16)
        assert torch.equal(head[draft_ids], rows)
        assert torch.equal(head[~drafter.t2d], rows.float().mean(0).to(torch.bfloat16).expand(VOCAB - 200, -1))
    full = load_file(str(save(medusa_for(target), tmp_path / "e") / "model.safetensors"))
    assert full["lm_heads.0.weight"].shape == (VOCAB, HIDDEN) and "d2t" not in full and "t2d" not in full


def vllm_medusa_drafts(directory, final, gamma):
    """What vLLM's Medusa model drafts from the saved tensors at T=0: per head, x + SiLU(W x + b) over the
    blocks, then the argmax over the head's V rows (model_executor/models/medusa.py, v1/spec_decode/medusa.py)."""
    config = json.loads((directory / "config.json").read_text())
    tensors = {name: t.float() for name, t in load_file(str(directory / "model.safetensors")).items()}
    drafts = []
    for k in range(gamma):
        x = final
        for j in range(config["num_hidden_layers"]):
            weight, bias = tensors[f"blocks.{k}.layers.{j}.weight"], tensors[f"blocks.{k}.layers.{j}.bias"]
            x = x + torch.nn.functional.silu(x @ weight.T + bias)
        drafts.append((x @ tensors[f"lm_heads.{k}.weight"].T).argmax(-1))
    return torch.stack(drafts, -1)


@pytest.mark.parametrize("draft_vocab_size", [None, 200])
def test_vllms_reading_of_the_files_drafts_what_the_reference_drafts(target, tmp_path, draft_vocab_size):
    drafter = perturbed(medusa_for(target, draft_vocab_size))
    out = save(drafter, tmp_path / "d")
    final = capture(
        target, torch.randint(0, VOCAB, (4, 16), generator=torch.Generator().manual_seed(7)), (1, 2, 3)
    ).final
    with torch.no_grad():
        reference = load_medusa(out).heads(final)
    reference_drafts = load_medusa(out).to_target_ids(reference.argmax(-1))
    assert torch.equal(vllm_medusa_drafts(out, final, 3), reference_drafts)
    assert torch.equal(vllm_medusa_drafts(out, final, 2), reference_drafts[..., :2])  # gamma below the heads


@pytest.mark.parametrize("draft_vocab_size", [None, 200])
def test_round_trip_gives_the_same_proposals(target, tmp_path, bf16_stored, draft_vocab_size):
    drafter = perturbed(medusa_for(target, draft_vocab_size))
    loaded = load_medusa(save(drafter, tmp_path / "d"))
    reference = bf16_stored(drafter)
    final = capture(
        target, torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(6)), (1, 2, 3)
    ).final
    with torch.no_grad():
        assert torch.allclose(loaded.heads(final), reference.heads(final), atol=1e-6)
    assert torch.equal(loaded.draft_token_ids, drafter.draft_token_ids) and loaded.config == drafter.config


def test_a_saved_drafter_decodes_the_targets_greedy_tokens_in_the_reference_engine(
    target, chain_batch, tmp_path, make_chains
):
    drafter = medusa_for(target, 200)
    optimizer = torch.optim.AdamW(drafter.parameters(), lr=3e-3)
    for _ in range(40):
        optimizer.zero_grad()
        drafter.training_loss(chain_batch, 1, 0.0, None).total.backward()
        optimizer.step()
    loaded = load_drafter(save(drafter, tmp_path / "d"))
    engine = SpeculativeEngine(target, loaded, 3)
    accepted = draft_tokens = 0
    for prompt in make_chains(3, 6, seed=8):
        generation = engine.generate(prompt, 24)
        assert generation.token_ids == greedy_reference(target, prompt, 24)
        accepted += generation.stats.accepted
        draft_tokens += generation.stats.draft_tokens
    assert 0 < accepted < draft_tokens  # drafts both kept and rejected


def test_bad_gamma_and_damaged_files_are_named(target, tmp_path):
    with pytest.raises(DraftsyncError, match="between 1 and 3"):
        save(medusa_for(target), tmp_path / "d", gamma=4)
    out = save(medusa_for(target), tmp_path / "e")
    (out / "model.safetensors").write_bytes(b"\x00" * 16)
    with pytest.raises(DraftsyncError, match="model.safetensors is not a readable safetensors file"):
        load_medusa(out)
    out = save(medusa_for(target), tmp_path / "f")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "num_heads": 4}))
    with pytest.raises(DraftsyncError, match="missing"):
        load_medusa(out)
    (out / "config.json").write_text(json.dumps({**config, "draftsync_drafter": "eagle"}))
    with pytest.raises(DraftsyncError, match="not a Medusa drafter config"):
        load_medusa(out)


def test_a_drafter_saved_before_the_vllm_layout_still_loads(target, tmp_path, bf16_stored):
    """No bias, heads of Dv rows and a token_map: what warm starts find from syncs before this layout."""
    drafter = perturbed(medusa_for(target, 200))
    with torch.no_grad():
        for block in drafter.blocks:
            for layer in block.layers:
                layer.bias.zero_()
    out = save(drafter, tmp_path / "d")
    tensors = {name: t for name, t in load_file(str(out / "model.safetensors")).items() if not name.endswith(".bias")}
    draft_ids = drafter.draft_token_ids
    tensors.update({f"lm_heads.{k}.weight": tensors[f"lm_heads.{k}.weight"][draft_ids].contiguous() for k in range(3)})
    save_file({**tensors, "token_map": draft_ids}, str(out / "model.safetensors"))
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "medusa_fc_bias": False, "truncated_vocab_size": 200}))
    final = capture(
        target, torch.randint(0, VOCAB, (2, 9), generator=torch.Generator().manual_seed(9)), (1, 2, 3)
    ).final
    with torch.no_grad():
        assert torch.allclose(load_medusa(out).heads(final), bf16_stored(drafter).heads(final), atol=1e-6)
