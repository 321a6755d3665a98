"""Every drafter method behind one door: build, save, load and size a drafter by its method name.

Methods (named in speculative/methods) and their checkpoint formats:
- the EAGLE-3 family (EAGLE-3, and EAGLE 3.1 with fc_norm and norm_output): the speculators format vLLM detects;
- EAGLE-1: the one-layer Llama layout vLLM's EAGLE method loads (eagle1/checkpoint.py);
- Medusa: the layout vLLM's Medusa method loads (medusa/checkpoint.py), plus draftsync's own keys;
- the draft model (the benchmarks' independent small LM): a plain HF checkpoint. It is a baseline, not a
  sync method, so `new_drafter` does not build it (the trainer sizes it).
A directory's config.json says which one it holds, so loading needs no method name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import (
    CHECKPOINT_METHODS,
    DRAFT_MODEL,
    EAGLE,
    EAGLE3,
    EAGLE3_1,
    MEDUSA,
    TRAINED_METHODS,
    eagle3_variant,
    is_eagle3_family,
)

if TYPE_CHECKING:
    import torch

# Options each method takes beyond the target's shapes, the draft vocabulary and the aux layer ids.
OPTIONS = {
    EAGLE3.name: ("norm_before_residual", "fc_norm", "norm_output", "norm_before_fc"),
    EAGLE3_1.name: ("norm_before_residual", "fc_norm", "norm_output"),
    EAGLE.name: ("feature_loss_weight", "token_loss_weight"),
    MEDUSA.name: ("num_heads", "num_layers", "loss_decay"),
}


def _check_method(method: str) -> None:
    if method not in TRAINED_METHODS:
        raise DraftsyncError(
            f"drafter method {method!r} is unknown",
            f"use one of {', '.join(TRAINED_METHODS)} (ngram and draft_model are benchmark baselines, not trained "
            "heads)",
        )


def _check_options(method: str, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(OPTIONS[method]))
    if unknown:
        raise DraftsyncError(
            f"{', '.join(unknown)} {'is not an option' if len(unknown) == 1 else 'are not options'} "
            f"of {method} drafters",
            f"use only {', '.join(OPTIONS[method]) or 'no options'} for method {method!r}",
        )


def new_drafter(
    method: str,
    target_config: Any,
    draft_vocab_size: int | None = None,
    aux_layer_ids: tuple[int, ...] | list[int] | None = None,
    **options: Any,
):
    """A freshly initialised drafter of `method` shaped for a target with `target_config` (a Llama config).

    `draft_vocab_size` None means the target's whole vocabulary; `aux_layer_ids` (EAGLE-3 only) None
    means the default depths. Set the draft vocabulary and call `initialise_from_target` afterwards.
    """
    _check_method(method)
    _check_options(method, options)
    if is_eagle3_family(method):
        from draftsync.speculative.methods.eagle3.model import Eagle3Config, Eagle3Drafter

        flags = dict(options)
        if method == EAGLE3_1.name:
            if flags.get("fc_norm") is False or flags.get("norm_output") is False:
                raise DraftsyncError(
                    f"an {EAGLE3_1} drafter was asked to go without fc_norm or norm_output",
                    f"EAGLE 3.1 is EAGLE-3 with both: use method {EAGLE3.name!r} to choose the flags",
                )
            flags.update(fc_norm=True, norm_output=True)
        return Eagle3Drafter(Eagle3Config.for_target(target_config, draft_vocab_size, aux_layer_ids, **flags))
    if aux_layer_ids is not None:
        raise DraftsyncError(
            f"aux layer ids {list(aux_layer_ids)} were given for a {method} drafter, which reads "
            "the target's final hidden state only",
            f"leave aux_layer_ids unset for method {method!r} (they apply to {EAGLE3} and {EAGLE3_1})",
        )
    if method == EAGLE.name:
        from draftsync.speculative.methods.eagle1.model import EagleConfig, EagleDrafter

        if draft_vocab_size not in (None, target_config.vocab_size):
            raise DraftsyncError(
                f"a draft vocabulary of {draft_vocab_size} was asked of an EAGLE-1 drafter",
                f"leave draft_vocab_size unset for method {EAGLE.name!r} (vLLM's EAGLE-1 predicts through the "
                f"target's lm_head, over the whole vocabulary); use {EAGLE3} or {MEDUSA} for a reduced draft "
                "vocabulary",
            )
        return EagleDrafter(EagleConfig.for_target(target_config, **options))
    from draftsync.speculative.methods.medusa.model import MedusaConfig, MedusaDrafter

    return MedusaDrafter(MedusaConfig.for_target(target_config, draft_vocab_size, **options))


def save_drafter(
    drafter: Any,
    out_dir: str | Path,
    verifier_name_or_path: str,
    verifier_architectures: list[str],
    speculative_tokens: int,
) -> Path:
    """Write `drafter` in its method's format to `out_dir` and return the directory."""
    method = getattr(drafter, "method", None)
    if is_eagle3_family(method):
        from draftsync.speculative.methods.eagle3.checkpoint import save_eagle3

        return save_eagle3(drafter, out_dir, verifier_name_or_path, verifier_architectures, speculative_tokens)
    if method == EAGLE.name:
        from draftsync.speculative.methods.eagle1.checkpoint import save_eagle

        return save_eagle(drafter, out_dir, verifier_name_or_path, verifier_architectures, speculative_tokens)
    if method == MEDUSA.name:
        from draftsync.speculative.methods.medusa.checkpoint import save_medusa

        return save_medusa(drafter, out_dir, verifier_name_or_path, verifier_architectures, speculative_tokens)
    if method == DRAFT_MODEL.name:
        from draftsync.speculative.methods.draft_model.model import save_draft_model

        return save_draft_model(
            drafter,
            out_dir,
            verifier_name_or_path=verifier_name_or_path,
            verifier_architectures=list(verifier_architectures),
            speculative_tokens=int(speculative_tokens),
        )
    raise DraftsyncError(
        f"a drafter of method {method!r} ({type(drafter).__name__}) has no checkpoint format here",
        f"save_drafter writes {', '.join(CHECKPOINT_METHODS)} drafters",
    )


def drafter_method(directory: str | Path) -> str:
    """The method of the drafter saved in `directory`, read from its config.json."""
    from draftsync.speculative.methods.checkpoint_files import read_json

    path, config = read_json(directory)
    if config.get("speculators_model_type") == EAGLE3.speculators_type:
        return eagle3_variant(bool(config.get("fc_norm")), bool(config.get("norm_output")))
    kind = config.get("draftsync_drafter")
    if kind in (EAGLE.name, MEDUSA.name, DRAFT_MODEL.name):
        return kind
    found = {key: config.get(key) for key in ("speculators_model_type", "draftsync_drafter", "model_type")}
    raise DraftsyncError(
        f"{path} is not the config of a drafter draftsync can read "
        f"({', '.join(f'{k}={v!r}' for k, v in found.items())})",
        f"point at a directory written by save_drafter ({', '.join(CHECKPOINT_METHODS)}); a target model's directory "
        "is not a drafter",
    )


def check_drafter_fits_target(drafter_dir: str | Path, target_dir: str | Path) -> None:
    """Refuse a drafter built for another vocabulary than the target's, from both config.json files alone, before
    any engine loads them (vLLM would start and then fail or serve garbage)."""
    from draftsync.speculative.methods.checkpoint_files import read_json

    _, config = read_json(drafter_dir)
    built_for = config.get("transformer_layer_config", {}).get("vocab_size", config.get("vocab_size"))
    target_vocab = read_json(target_dir)[1].get("vocab_size")
    if built_for is not None and target_vocab is not None and int(built_for) != int(target_vocab):
        raise DraftsyncError(
            f"drafter {drafter_dir} was built for a vocabulary of {built_for} tokens, target {target_dir} has "
            f"{target_vocab}",
            "train the drafter against this target (draftsync sync)",
        )


def load_drafter(directory: str | Path, dtype: torch.dtype | None = None):
    """The drafter saved in `directory`, whatever its method (float32 unless `dtype` says otherwise)."""
    method = drafter_method(directory)
    if is_eagle3_family(method):
        from draftsync.speculative.methods.eagle3.checkpoint import load_eagle3

        return load_eagle3(directory, dtype)
    if method == EAGLE.name:
        from draftsync.speculative.methods.eagle1.checkpoint import load_eagle

        return load_eagle(directory, dtype)
    if method == DRAFT_MODEL.name:
        from draftsync.speculative.methods.draft_model.model import load_draft_model

        return load_draft_model(directory, dtype)
    from draftsync.speculative.methods.medusa.checkpoint import load_medusa

    return load_medusa(directory, dtype)


@dataclass
class ParameterCount:
    """A drafter's size: all parameters, those that train, and those that are its own.

    `own` leaves out frozen copies of the target's tensors (`target_copy_names`: the embedding of EAGLE
    drafters, and EAGLE-1's lm_head), which serving takes from the target: own / target parameters is
    the drafter's "% of target".
    """

    total: int
    trainable: int
    own: int


def parameter_count(drafter: Any) -> ParameterCount:
    copies = set(getattr(drafter, "target_copy_names", ()))
    total = trainable = shared = 0
    for name, parameter in drafter.named_parameters():
        total += parameter.numel()
        trainable += parameter.numel() if parameter.requires_grad else 0
        shared += parameter.numel() if name in copies else 0
    return ParameterCount(total=total, trainable=trainable, own=total - shared)
