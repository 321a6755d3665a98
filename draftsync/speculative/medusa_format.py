"""Medusa drafters on disk: a format of our own (vLLM 0.33 serves no Medusa), close to vLLM's old Medusa one.

A directory holds `config.json` and `model.safetensors` (bf16; integer buffers as they are).

config.json fields:
- `draftsync_drafter`: "medusa" (how load_drafter recognises the format);
- `architectures` ["MedusaModel"], `model_type` "medusa": the names vLLM's Medusa model used;
- `hidden_size` (the target's), `vocab_size` (the target's V), `num_heads` (K, one proposal each),
  `num_hidden_layers` (residual blocks per head), `truncated_vocab_size` and `draft_vocab_size` (both Dv,
  the rows of each head), `medusa_fc_bias` (false), `loss_decay` (head k's training weight is decay**k);
- `speculative_tokens` (the gamma the drafter was validated at, at most K), `verifier`
  ({name_or_path, architectures} of the target), `torch_dtype` "bfloat16".

model.safetensors tensors: `blocks.{k}.layers.{j}.weight` [H, H], `lm_heads.{k}.weight` [Dv, H], and when
Dv < V `d2t` (int64 [Dv], target id = i + d2t[i]), `t2d` (bool [V]) and `token_map` (int64 [Dv], the target
id of each row: the name vLLM's Medusa loader reads a reduced vocabulary from).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.checkpoint_files import (
    CONFIG_FILE,
    bf16_tensors,
    check_tensors,
    config_value,
    read_json,
    read_safetensors,
    write_directory,
)

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.medusa import MedusaDrafter

WEIGHTS_FILE = "model.safetensors"
ARCHITECTURE = "MedusaModel"
DRAFTER_KIND = "medusa"


def medusa_config(drafter: MedusaDrafter, verifier_name_or_path: str, verifier_architectures: list[str],
                  speculative_tokens: int) -> dict[str, Any]:
    """The whole config.json of a Medusa drafter directory."""
    config = drafter.config
    return {
        "draftsync_drafter": DRAFTER_KIND,
        "architectures": [ARCHITECTURE],
        "model_type": "medusa",
        "hidden_size": config.hidden_size,
        "vocab_size": config.vocab_size,
        "num_heads": config.num_heads,
        "num_hidden_layers": config.num_layers,
        "truncated_vocab_size": config.draft_vocab_size,
        "draft_vocab_size": config.draft_vocab_size,
        "medusa_fc_bias": False,
        "loss_decay": config.loss_decay,
        "speculative_tokens": speculative_tokens,
        "verifier": {"name_or_path": verifier_name_or_path, "architectures": list(verifier_architectures)},
        "torch_dtype": "bfloat16",
    }


def save_medusa(drafter: MedusaDrafter, out_dir: str | Path, verifier_name_or_path: str,
                verifier_architectures: list[str], speculative_tokens: int) -> Path:
    """Write the drafter to `out_dir` (created; files replaced atomically) and return the directory."""
    heads = drafter.config.num_heads
    if not 1 <= speculative_tokens <= heads:
        raise DraftsyncError(f"speculative_tokens={speculative_tokens} does not fit a Medusa drafter of {heads} heads",
                             f"record a gamma between 1 and {heads} (one token per head)")
    tensors = bf16_tensors(drafter.state_dict())
    if drafter.d2t is not None:
        tensors["token_map"] = drafter.draft_token_ids.detach().cpu().contiguous()
    config = medusa_config(drafter, verifier_name_or_path, verifier_architectures, speculative_tokens)
    return write_directory(out_dir, {WEIGHTS_FILE: tensors}, {CONFIG_FILE: config})


def is_medusa_config(config: dict[str, Any]) -> bool:
    return config.get("draftsync_drafter") == DRAFTER_KIND


def load_medusa(directory: str | Path, dtype: torch.dtype | None = None) -> MedusaDrafter:
    """Read a drafter written by save_medusa into a MedusaDrafter (float32 unless `dtype` says otherwise)."""
    import torch

    from draftsync.speculative.medusa import MedusaConfig, MedusaDrafter

    path, config = read_json(directory)
    if not is_medusa_config(config):
        raise DraftsyncError(f"{path} is not a Medusa drafter config (draftsync_drafter is "
                             f"{config.get('draftsync_drafter')!r}, not 'medusa')",
                             "load it with drafters.load_drafter, which detects the format, or re-save it")
    drafter = MedusaDrafter(MedusaConfig(
        hidden_size=config_value(config, path, "hidden_size"),
        vocab_size=config_value(config, path, "vocab_size"),
        draft_vocab_size=config_value(config, path, "draft_vocab_size"),
        num_heads=config_value(config, path, "num_heads"),
        num_layers=config_value(config, path, "num_hidden_layers"),
        loss_decay=config.get("loss_decay", 0.8),
    ))
    weights_path = Path(directory) / WEIGHTS_FILE
    tensors = read_safetensors(weights_path)
    tensors.pop("token_map", None)  # derived from d2t, kept for vLLM's loader only
    expected = drafter.state_dict()
    check_tensors(tensors, expected, str(weights_path))
    drafter.load_state_dict(tensors, strict=True)
    return drafter.to(dtype or torch.float32).eval()
