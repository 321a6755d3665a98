"""The draft_model checkpoint: an ordinary HF directory (config.json + model.safetensors), which vLLM serves as it
is, with a small `draftsync_drafter.json` marker beside it (config.json also carries `"draftsync_drafter":
"draft_model"`, the key the other formats use)."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import DRAFT_MODEL
from draftsync.speculative.methods.checkpoint_files import CONFIG_FILE, SavedFor
from draftsync.speculative.methods.draft_model.model import DraftModelDrafter

MARKER_FILE = "draftsync_drafter.json"


def save_draft_model(drafter: DraftModelDrafter, out_dir: Path | str, saved_for: SavedFor) -> Path:
    """A plain HF checkpoint (config.json, model.safetensors) plus the marker naming the method and what the
    drafter was saved for."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    drafter.config.draftsync_drafter = DraftModelDrafter.method  # config.json names the method too
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a shard-writing bar per save clutters training logs
    try:
        drafter.lm.save_pretrained(out)
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    marker = {"method": DraftModelDrafter.method, "format": "hf-causal-lm", **asdict(saved_for)}
    (out / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return out


def load_draft_model(path: Path | str, dtype: torch.dtype | None = None) -> DraftModelDrafter:
    """Load what save_draft_model wrote; errors name the directory and what is missing."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    path = Path(path)
    marker_path = path / MARKER_FILE
    if not marker_path.is_file() or not (path / CONFIG_FILE).is_file():
        raise DraftsyncError(
            f"{path} is not a draft_model checkpoint (no {MARKER_FILE} or {CONFIG_FILE})",
            "point at a directory written by save_draft_model",
        )
    try:
        marker = json.loads(marker_path.read_text())
    except json.JSONDecodeError as error:
        raise DraftsyncError(f"{marker_path} is not valid JSON ({error})", "rewrite it with save_draft_model") from None
    if marker.get("method") != DraftModelDrafter.method:
        raise DraftsyncError(
            f"{marker_path} names method {marker.get('method')!r}, not {DRAFT_MODEL.name!r}",
            "load it with the loader of its own method (load_drafter)",
        )
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        raise DraftsyncError(f"{path} holds no safetensors weights", "save the drafter again with save_draft_model")
    drafter = DraftModelDrafter(LlamaConfig.from_pretrained(path))
    state: dict[str, torch.Tensor] = {}
    for file in weights:
        state.update(load_file(str(file)))
    missing, unexpected = drafter.lm.load_state_dict(state, strict=False)
    missing = [name for name in missing if not (drafter.config.tie_word_embeddings and name == "lm_head.weight")]
    if missing or unexpected:
        raise DraftsyncError(
            f"{path} weights do not fit its config (missing {missing[:3]}, unexpected {unexpected[:3]})",
            "save the drafter again with save_draft_model",
        )
    if drafter.config.tie_word_embeddings:
        drafter.lm.tie_weights()
    if dtype is not None:
        drafter.to(dtype)
    return drafter.eval()
