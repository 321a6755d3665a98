"""P-EAGLE drafters on disk: the speculators `peagle` format, which vLLM serves as EAGLE-3 with parallel drafting.

The directory is an EAGLE-3 one (eagle3/checkpoint.py: config.json and bf16 `model.safetensors` under the speculators
and vLLM names) with three differences vLLM reads (transformers_utils/configs/speculators/algos.py `update_peagle`):
`speculators_model_type` P-EAGLE's (vLLM then builds `Eagle3LlamaForCausalLM` and sets `pard_token`, its masked slots'
token id, from it), the top-level `mask_token_id`, and the `mask_hidden` tensor [1, n_aux * target hidden] that
`Eagle3LlamaForCausalLM.load_weights` requires once `parallel_drafting` is on. vLLM's P-EAGLE reader drops
`fc_norm` and `norm_output`, so a P-EAGLE drafter has neither. draftsync's own: `max_draft_tokens`, the depths it
was trained for (vLLM keeps drafting past them, untrained).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import PEAGLE
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
from draftsync.speculative.methods.eagle3.checkpoint import WEIGHTS_FILE, speculators_config

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.methods.peagle.model import PEagleDrafter

ARCHITECTURE = "PEagleSpeculator"  # speculators' name for its P-EAGLE model (vLLM picks its own class)


def peagle_config(drafter: PEagleDrafter, saved_for: SavedFor) -> dict[str, Any]:
    """The whole config.json: EAGLE-3's, under the P-EAGLE type, with the mask token and the trained depths."""
    config = speculators_config(drafter, saved_for)
    config["architectures"] = [ARCHITECTURE]
    config["speculators_model_type"] = PEAGLE.speculators_type
    config["speculators_config"]["algorithm"] = PEAGLE.speculators_type
    config["mask_token_id"] = drafter.config.mask_token_id
    config["max_draft_tokens"] = drafter.config.max_draft_tokens
    return config


def save_peagle(drafter: PEagleDrafter, out_dir: str | Path, saved_for: SavedFor) -> Path:
    """Write the drafter to `out_dir` (created; files replaced atomically) and return the directory."""
    if saved_for.speculative_tokens > drafter.config.max_draft_tokens:
        raise DraftsyncError(
            f"gamma {saved_for.speculative_tokens} was recorded for a P-EAGLE drafter trained to draft "
            f"{drafter.config.max_draft_tokens} tokens",
            f"record a gamma of at most {drafter.config.max_draft_tokens}, or train with a larger max_draft_tokens",
        )
    return write_directory(
        out_dir, {WEIGHTS_FILE: bf16_tensors(drafter.state_dict())}, {CONFIG_FILE: peagle_config(drafter, saved_for)}
    )


def load_peagle(directory: str | Path, dtype: torch.dtype | None = None) -> PEagleDrafter:
    """Read a drafter written by save_peagle into a PEagleDrafter (float32 unless `dtype` says otherwise)."""
    import torch

    from draftsync.speculative.methods.eagle3.checkpoint import _drafter_config
    from draftsync.speculative.methods.peagle.model import PEagleConfig, PEagleDrafter

    path, config = read_json(directory)
    if config.get("speculators_model_type") != PEAGLE.speculators_type:
        raise DraftsyncError(
            f"{path} has speculators_model_type {config.get('speculators_model_type')!r}, not "
            f"{PEAGLE.speculators_type!r}",
            "load a P-EAGLE drafter saved by save_drafter",
        )
    layer = _drafter_config(config, path).to_dict()
    drafter = PEagleDrafter(
        PEagleConfig(
            **layer,
            mask_token_id=config_value(config, path, "mask_token_id"),
            max_draft_tokens=config_value(config, path, "max_draft_tokens"),
        )
    )
    weights_path = Path(directory) / WEIGHTS_FILE
    expected = drafter.state_dict()
    tensors = {name: tensor for name, tensor in read_safetensors(weights_path).items() if name in expected}
    check_tensors(tensors, expected, str(weights_path))
    drafter.load_state_dict(tensors, strict=True)
    return drafter.to(dtype or torch.float32).eval()
