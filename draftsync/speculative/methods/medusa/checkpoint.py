"""Medusa drafters on disk, in the layout vLLM's Medusa method loads as a sync writes it.

vLLM (`model_executor/models/medusa.py`, `transformers_utils/configs/medusa.py`) gives every head an lm_head
over the whole vocabulary V. Its reduced vocabulary (`truncated_vocab_size` < V with a `token_map`) works
only with one lm_head shared by all heads (`original_lm_head`); with an lm_head per head its loader cuts
the rows to the token map and then fails on a head of V rows. So a head trained over a draft vocabulary
of Dv < V ids (cheaper to train) is widened to V rows here: its own rows at their target ids, and every
other row the mean of the draft rows, whose logit is the mean of the draft logits, below their maximum
unless all of them tie. Greedy drafts over V rows are then the drafts over Dv rows, in vLLM and in the
reference engine alike; the price is V rows per head in the served drafter, as in any Medusa checkpoint
vLLM loads with a head per lm_head.

A directory holds `config.json` and `model.safetensors` (bf16; integer and bool buffers as they are).

config.json fields, read by vLLM's MedusaConfig:
- `model_type` (vLLM's method name for Medusa), `architectures` ["MedusaModel"];
- `hidden_size` (the target's), `vocab_size` (the target's V), `num_heads` (K, one proposal each),
  `num_hidden_layers` (residual blocks per head), `truncated_vocab_size` (V: every lm_head spans the
  vocabulary), `medusa_fc_bias` (true: each block is x + SiLU(W x + b)).
draftsync's own, which vLLM keeps as plain attributes:
- `draftsync_drafter`, the method's name (how load_drafter recognises the format), `draft_vocab_size` (Dv, the rows
  the heads were trained over), `loss_decay` (head k's training weight is decay**k), `speculative_tokens`
  (the gamma the drafter was validated at, at most K), `verifier` ({name_or_path, architectures} of the
  target), `torch_dtype` "bfloat16".

model.safetensors tensors: `blocks.{k}.layers.{j}.weight` [H, H] and `.bias` [H], `lm_heads.{k}.weight`
[V, H], and when Dv < V `d2t` (int64 [Dv], target id = i + d2t[i]) and `t2d` (bool [V]), which vLLM
skips and the reference engine reads the trained rows back with. No `token_map`: vLLM applies one only
to a truncated vocabulary.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import MEDUSA
from draftsync.speculative.methods.checkpoint_files import (
    CONFIG_FILE,
    SavedFor,
    bf16_tensors,
    check_tensors,
    config_value,
    read_json,
    read_safetensors,
    write_directory,
)

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.methods.medusa.model import MedusaDrafter

WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = "MedusaModel"
DRAFTER_KIND = MEDUSA.name  # config.json's `draftsync_drafter`


def medusa_config(drafter: MedusaDrafter, saved_for: SavedFor) -> dict[str, Any]:
    """The whole config.json of a Medusa drafter directory."""
    config = drafter.config
    return {
        "draftsync_drafter": DRAFTER_KIND,
        "architectures": [ARCHITECTURE],
        "model_type": MEDUSA.vllm_method,  # vLLM's MedusaConfig is registered under its method name
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        "truncated_vocab_size": config.vocab_size,
        "medusa_fc_bias": True,
        "draft_vocab_size": config.draft_vocab_size,
        "loss_decay": config.loss_decay,
        "speculative_tokens": saved_for.speculative_tokens,
        "verifier": saved_for.verifier(),
        "torch_dtype": "bfloat16",
    }


def widened_head(rows: torch.Tensor, draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V, H] lm_head from the [Dv, H] `rows` of the target ids `draft_ids`; other rows are their mean."""
    filler = rows.float().mean(dim=0).to(rows.dtype)
    head = filler.expand(vocab_size, rows.shape[1]).clone()
    head[draft_ids] = rows
    return head.contiguous()


def save_medusa(drafter: MedusaDrafter, out_dir: str | Path, saved_for: SavedFor) -> Path:
    """Write the drafter to `out_dir` (created; files replaced atomically) and return the directory."""
    heads = drafter.config.num_heads
    if saved_for.speculative_tokens > heads:
        raise DraftsyncError(
            f"speculative_tokens={saved_for.speculative_tokens} does not fit a Medusa drafter of {heads} heads",
            f"record a gamma between 1 and {heads} (one token per head)",
        )
    tensors = bf16_tensors(drafter.state_dict())
    if drafter.d2t is not None:
        draft_ids = drafter.draft_token_ids.cpu()
        for k in range(heads):
            name = f"lm_heads.{k}.weight"
            tensors[name] = widened_head(tensors[name], draft_ids, drafter.config.vocab_size)
    config = medusa_config(drafter, saved_for)
    return write_directory(out_dir, {WEIGHTS_FILE: tensors}, {CONFIG_FILE: config})


def is_medusa_config(config: dict[str, Any]) -> bool:
    return config.get("draftsync_drafter") == DRAFTER_KIND


def load_medusa(directory: str | Path, dtype: torch.dtype | None = None) -> MedusaDrafter:
    """Read a drafter written by save_medusa into a MedusaDrafter over its draft vocabulary (float32 unless
    `dtype` says otherwise): the rows the heads were trained over, which give the drafts vLLM gives.

    Drafters saved before this layout (`medusa_fc_bias` false: blocks without bias, heads of Dv rows and a
    `token_map`) still load, with zero biases, which compute the same, so a sync can warm-start from them.
    """
    import torch

    from draftsync.speculative.methods.medusa.model import MedusaConfig, MedusaDrafter

    path, config = read_json(directory)
    if not is_medusa_config(config):
        raise DraftsyncError(
            f"{path} is not a Medusa drafter config (draftsync_drafter is "
            f"{config.get('draftsync_drafter')!r}, not {DRAFTER_KIND!r})",
            "load it with registry.load_drafter, which detects the format, or re-save it",
        )
    drafter = MedusaDrafter(
        MedusaConfig(
            hidden_size=config_value(config, path, "hidden_size"),
            vocab_size=config_value(config, path, "vocab_size"),
            draft_vocab_size=config_value(config, path, "draft_vocab_size"),
            num_heads=config_value(config, path, "num_heads"),
            num_layers=config_value(config, path, "num_hidden_layers"),
            loss_decay=config.get("loss_decay", 0.8),
        )
    )
    weights_path = Path(directory) / WEIGHTS_FILE
    tensors = read_safetensors(weights_path)
    expected = drafter.state_dict()
    heads = [f"lm_heads.{k}.weight" for k in range(drafter.config.num_heads)]
    vllm_layout = config.get("medusa_fc_bias") is True  # else the layout before it (see above)
    if vllm_layout:
        shape = (drafter.config.vocab_size, drafter.config.hidden_size)
        expected = {**expected, **{name: torch.empty(shape, device="meta") for name in heads}}
    else:
        tensors.pop("token_map", None)
        tensors.update({name: torch.zeros_like(tensor) for name, tensor in expected.items() if name.endswith(".bias")})
    check_tensors(tensors, expected, str(weights_path))
    drafter.set_draft_vocab(tensors.get("d2t"), tensors.get("t2d"))
    if vllm_layout and drafter.d2t is not None:
        tensors.update({name: tensors[name][drafter.draft_token_ids] for name in heads})
    drafter.load_state_dict(tensors, strict=True)
    return drafter.to(dtype or torch.float32).eval()
