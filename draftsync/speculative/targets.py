"""Any target, loaded and checked: its config, its architecture facts, the model and tokenizer, and its identity.

What a sync cannot use (no config.json, remote code not trusted, weights that do not fit their config, a decoder
draftsync cannot read hidden states from, a tokenizer larger than the vocabulary) is refused with the fix. The demo's
own targets are built in `draftsync.speculative.builtin.targets`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from draftsync.errors import DraftsyncError
from draftsync.speculative.target_description import describe, read_target_config

if TYPE_CHECKING:
    from transformers import PreTrainedModel

TARGET_INFO_FILE = "draftsync_target.json"


def describe_target(path: Path) -> dict:
    """Architecture facts for registry tags, read from config and safetensors headers without loading weights.

    A checkpoint draftsync cannot sync (a family it does not train drafters for, a config it cannot size, weights
    that are not what its quantization declares) is refused here, before its weights are read or stored."""
    from draftsync.speculative.families import config_features

    path = Path(path)
    description = describe(path)
    description.require_supported()
    if description.checkpoint_bytes_from != "files":
        raise DraftsyncError(
            f"target checkpoint {path} has no *.safetensors weights", "save it with save_pretrained (safetensors)"
        )
    info_file = path / TARGET_INFO_FILE
    info = json.loads(info_file.read_text()) if info_file.exists() else {}
    return {
        "architecture": description.architecture,
        "hidden_size": description.hidden,
        "num_layers": description.layers,
        "vocab_size": description.vocab,
        "parameter_count": description.parameters,
        "family": description.family,
        "features": {**config_features(description.config), **description.size_features()},
        "task_mix": info.get("task_mix", {}),
    }


def _trusting(requested: bool | None) -> bool:
    """Whether a checkpoint's own code may run: as asked, else as DRAFTSYNC_TRUST_REMOTE_CODE says (off unless
    configured). Read only when not asked, so a training rank given the sync's answer needs no settings."""
    if requested is not None:
        return requested
    from draftsync.settings import Settings

    return Settings().trust_remote_code


def load_target(path: Path, trust_remote_code: bool | None = None, load_options: dict[str, Any] | None = None):
    """Load (model, tokenizer) in eval mode, failing with a clear error on anything a sync cannot use.

    `trust_remote_code` None: DRAFTSYNC_TRUST_REMOTE_CODE decides (off unless configured). `load_options`: where and
    in which dtype (`placement.from_pretrained_options`); None: on the CPU in fp32.
    """
    import torch
    from transformers import AutoModelForCausalLM

    trust_remote_code = _trusting(trust_remote_code)
    path = Path(path)
    config = read_target_config(path)
    if config.get("auto_map") and not trust_remote_code:
        raise DraftsyncError(
            f"target {path} needs trust_remote_code (its config has auto_map)",
            "review its code, then set DRAFTSYNC_TRUST_REMOTE_CODE=true",
        )
    describe_target(path)  # checks the weight headers before a long load
    try:
        loaded = AutoModelForCausalLM.from_pretrained(
            path,
            trust_remote_code=trust_remote_code,
            output_loading_info=True,
            **(load_options if load_options is not None else {"dtype": torch.float32}),
        )
        # With output_loading_info=True it returns (model, loading info); transformers types the model only.
        model, loading = cast("tuple[PreTrainedModel, dict[str, list[str]]]", loaded)
    except Exception as exc:
        raise DraftsyncError(
            f"target {path} could not be loaded ({type(exc).__name__}: {exc})", "re-export the checkpoint"
        ) from exc
    # transformers fills weights its config expects but the files lack with random values, silently.
    missing = sorted(loading.get("missing_keys") or ())
    if missing:
        raise DraftsyncError(
            f"target {path}: its weights do not fit its config.json ({type(model).__name__}); "
            f"{len(missing)} tensors missing, e.g. {', '.join(missing[:3])}",
            "keep the config.json that was saved with these weights (save_pretrained writes both)",
        )
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise DraftsyncError(
            f"target {path} is a {type(model).__name__}: draftsync reads hidden states from a Llama-style decoder "
            "(model.model.layers), which it does not have",
            "register a Llama-style decoder-only checkpoint (Llama, Mistral, Qwen2/3 and the like)",
        )
    tokenizer = load_tokenizer(path, trust_remote_code, model.config.vocab_size)
    model.eval()
    return model, tokenizer


def load_tokenizer(path: Path, trust_remote_code: bool | None = None, vocab_size: int | None = None) -> Any:
    """The target's tokenizer alone (for work before its weights are loaded), checked against its vocabulary
    (`vocab_size`; None: its config's)."""
    from transformers import AutoTokenizer

    trust_remote_code = _trusting(trust_remote_code)
    path = Path(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        raise DraftsyncError(
            f"tokenizer of target {path} could not be loaded ({exc})", "save the tokenizer files beside the weights"
        ) from exc
    vocab = vocab_size if vocab_size is not None else int(read_target_config(path).get("vocab_size") or 0)
    if vocab and len(tokenizer) > vocab:
        raise DraftsyncError(
            f"tokenizer of target {path} has {len(tokenizer)} tokens but the model's vocabulary is {vocab}",
            "use the tokenizer the target was trained with",
        )
    return tokenizer


def load_target_head(
    path: Path, load_options: dict[str, Any] | None = None, trust_remote_code: bool | None = None
) -> Any:
    """The target without its decoder layers, for a training rank that reads stored states: only its embedding, final
    norm and lm_head are read from the files (a few GB of a 70B target's 141), while its fingerprint is that of the
    whole target, taken from the files, so the dataset check holds. A checkpoint whose files do not name every tensor
    of the model is loaded whole and its layers dropped, as before."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    options = load_options if load_options is not None else {"dtype": torch.float32}
    trust = _trusting(trust_remote_code)
    read_target_config(path)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust)
    fingerprint = _file_fingerprint(path, config, options["dtype"], trust)
    if fingerprint is None:
        whole, _ = load_target(path, trust, load_options=options)
        return without_decoder_layers(whole)
    describe_target(path)
    layers, layer_types = config.num_hidden_layers, getattr(config, "layer_types", None)
    config.num_hidden_layers = 0
    if layer_types is not None:
        config.layer_types = []
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # the layers' tensors are left unread on purpose, not "unexpected"
    try:
        model = AutoModelForCausalLM.from_pretrained(path, config=config, trust_remote_code=trust, **options)
    except Exception as exc:
        raise DraftsyncError(
            f"target {path} could not be loaded ({type(exc).__name__}: {exc})", "re-export the checkpoint"
        ) from exc
    finally:
        transformers_logging.set_verbosity(verbosity)
    model.config.num_hidden_layers = layers  # the target's shape, which the drafter and the dataset checks read
    if layer_types is not None:
        model.config.layer_types = layer_types
    return _keeping_fingerprint(model.eval(), fingerprint)


def without_decoder_layers(model: Any) -> Any:
    """`model` with its decoder layers dropped, keeping the whole target's fingerprint (the dataset is checked
    against it): what training on stored states reads of a target."""
    import torch

    _keeping_fingerprint(model, target_fingerprint(model))
    model.get_decoder().layers = torch.nn.ModuleList()
    return model


def _keeping_fingerprint(model: Any, fingerprint: str) -> Any:
    model.draftsync_fingerprint = fingerprint  # what target_fingerprint answers from now on
    return model


def _file_fingerprint(path: Path, config: Any, dtype: Any, trust_remote_code: bool) -> str | None:
    """`target_fingerprint` of the target loaded in `dtype`, from the safetensors files without loading it: the
    model's tensor names and shapes from a skeleton on the meta device, the first 64 values of each read from the
    files. None when a tensor is not in the files under its name (nor tied to the embedding)."""
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    index = path / "model.safetensors.index.json"
    if index.is_file():
        files = {name: path / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    elif (path / "model.safetensors").is_file():
        with safe_open(str(path / "model.safetensors"), "pt") as single:
            files = dict.fromkeys(single.keys(), path / "model.safetensors")
    else:
        return None
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code, dtype=dtype)
    tied = getattr(config, "tie_word_embeddings", False) and "lm_head.weight" not in files
    embedding = "model.embed_tokens.weight"
    digest = hashlib.sha256()
    handles: dict[Path, Any] = {}
    try:
        for name, tensor in skeleton.state_dict().items():
            stored = embedding if tied and name == "lm_head.weight" else name
            if stored not in files:
                return None
            file = files[stored]
            if file not in handles:
                handles[file] = safe_open(str(file), "pt")
            view = handles[file].get_slice(stored)
            shape = tuple(view.get_shape())
            if shape != tuple(tensor.shape):
                return None
            rows = math.ceil(64 / math.prod(shape[1:])) if len(shape) > 1 and math.prod(shape[1:]) else 64
            first = view[:rows] if shape else view[:]
            digest.update(f"{name}:{shape}".encode())
            values = first.reshape(-1)[:64].to(dtype).to(torch.float32)
            digest.update(values.numpy().tobytes())
    finally:
        handles.clear()
    return digest.hexdigest()[:32]


def target_fingerprint(model: Any) -> str:
    """A cheap identity of the target's weights: names, shapes and the first values of every tensor (the one taken
    before placement.drop_decoder_layers reduced it, when it was)."""
    import torch

    kept = getattr(model, "draftsync_fingerprint", None)
    if kept is not None:
        return kept
    digest = hashlib.sha256()
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            digest.update(f"{name}:{tuple(tensor.shape)}".encode())
            digest.update(tensor.detach().reshape(-1)[:64].to(torch.float32).cpu().numpy().tobytes())
    return digest.hexdigest()[:32]
