"""Every drafter method behind one door: build, save, load and size a drafter by its method name.

Methods and their checkpoint formats:
- "eagle3", "eagle3.1" (EAGLE-3 with fc_norm and norm_output): the speculators format vLLM detects;
- "eagle" (EAGLE-1): the one-layer Llama layout vLLM's `method: "eagle"` loads;
- "medusa": the layout vLLM's `method: "medusa"` loads (medusa_format.py), plus draftsync's own keys;
- "draft_model" (the benchmarks' independent small LM, vLLM's `method: "draft_model"`): a plain HF
  checkpoint. It is a baseline, not a sync method, so `new_drafter` does not build it (the trainer sizes it).
A directory's config.json says which one it holds, so loading needs no method name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError

if TYPE_CHECKING:
    import torch

METHODS = ("eagle3", "eagle3.1", "eagle", "medusa")

# Options each method takes beyond the target's shapes, the draft vocabulary and the aux layer ids.
OPTIONS = {
    "eagle3": ("norm_before_residual", "fc_norm", "norm_output", "norm_before_fc"),
    "eagle3.1": ("norm_before_residual", "fc_norm", "norm_output"),
    "eagle": ("feature_loss_weight", "token_loss_weight"),
    "medusa": ("num_heads", "num_layers", "loss_decay"),
}


def _check_method(method: str) -> None:
    if method not in METHODS:
        raise DraftsyncError(
            f"drafter method {method!r} is unknown",
            f"use one of {', '.join(METHODS)} (ngram and draft_model are benchmark baselines, not trained heads)",
        )


def _check_options(method: str, options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(OPTIONS[method]))
    if unknown:
        raise DraftsyncError(f"{', '.join(unknown)} {'is not an option' if len(unknown) == 1 else 'are not options'} "
                             f"of {method} drafters",
                             f"use only {', '.join(OPTIONS[method]) or 'no options'} for method {method!r}")


def new_drafter(method: str, target_config: Any, draft_vocab_size: int | None = None,
                aux_layer_ids: tuple[int, ...] | list[int] | None = None, **options: Any):
    """A freshly initialised drafter of `method` shaped for a target with `target_config` (a Llama config).

    `draft_vocab_size` None means the target's whole vocabulary; `aux_layer_ids` (EAGLE-3 only) None
    means the default depths. Set the draft vocabulary and call `initialise_from_target` afterwards.
    """
    _check_method(method)
    _check_options(method, options)
    if method in ("eagle3", "eagle3.1"):
        from draftsync.speculative.eagle3 import Eagle3Config, Eagle3Drafter

        flags = dict(options)
        if method == "eagle3.1":
            if flags.get("fc_norm") is False or flags.get("norm_output") is False:
                raise DraftsyncError("an eagle3.1 drafter was asked to go without fc_norm or norm_output",
                                     "EAGLE 3.1 is EAGLE-3 with both: use method 'eagle3' to choose the flags")
            flags.update(fc_norm=True, norm_output=True)
        return Eagle3Drafter(Eagle3Config.for_target(target_config, draft_vocab_size, aux_layer_ids, **flags))
    if aux_layer_ids is not None:
        raise DraftsyncError(f"aux layer ids {list(aux_layer_ids)} were given for a {method} drafter, which reads "
                             "the target's final hidden state only",
                             f"leave aux_layer_ids unset for method {method!r} (they apply to eagle3 and eagle3.1)")
    if method == "eagle":
        from draftsync.speculative.eagle1 import EagleConfig, EagleDrafter

        if draft_vocab_size not in (None, target_config.vocab_size):
            raise DraftsyncError(
                f"a draft vocabulary of {draft_vocab_size} was asked of an EAGLE-1 drafter",
                "leave draft_vocab_size unset for method 'eagle' (vLLM's EAGLE-1 predicts through the target's "
                "lm_head, over the whole vocabulary); use eagle3 or medusa for a reduced draft vocabulary",
            )
        return EagleDrafter(EagleConfig.for_target(target_config, **options))
    from draftsync.speculative.medusa import MedusaConfig, MedusaDrafter

    return MedusaDrafter(MedusaConfig.for_target(target_config, draft_vocab_size, **options))


def save_drafter(drafter: Any, out_dir: str | Path, verifier_name_or_path: str, verifier_architectures: list[str],
                 speculative_tokens: int) -> Path:
    """Write `drafter` in its method's format to `out_dir` and return the directory."""
    method = getattr(drafter, "method", None)
    if method in ("eagle3", "eagle3.1"):
        from draftsync.speculative.speculators_format import save_eagle3 as save
    elif method == "eagle":
        from draftsync.speculative.eagle1_format import save_eagle as save
    elif method == "medusa":
        from draftsync.speculative.medusa_format import save_medusa as save
    elif method == "draft_model":
        from draftsync.speculative.draft_model import save_draft_model

        return save_draft_model(drafter, out_dir, verifier_name_or_path=verifier_name_or_path,
                                verifier_architectures=list(verifier_architectures),
                                speculative_tokens=int(speculative_tokens))
    else:
        raise DraftsyncError(f"a drafter of method {method!r} ({type(drafter).__name__}) has no checkpoint format here",
                             f"save_drafter writes {', '.join(METHODS)} drafters")
    return save(drafter, out_dir, verifier_name_or_path, verifier_architectures, speculative_tokens)


def drafter_method(directory: str | Path) -> str:
    """The method of the drafter saved in `directory`, read from its config.json."""
    from draftsync.speculative.checkpoint_files import read_json

    path, config = read_json(directory)
    if config.get("speculators_model_type") == "eagle3":
        return "eagle3.1" if config.get("fc_norm") and config.get("norm_output") else "eagle3"
    kind = config.get("draftsync_drafter")
    if kind in ("eagle", "medusa", "draft_model"):
        return kind
    found = {key: config.get(key) for key in ("speculators_model_type", "draftsync_drafter", "model_type")}
    raise DraftsyncError(
        f"{path} is not the config of a drafter draftsync can read ({', '.join(f'{k}={v!r}' for k, v in found.items())})",
        f"point at a directory written by save_drafter ({', '.join(METHODS)}); a target model's directory "
        "is not a drafter",
    )


def load_drafter(directory: str | Path, dtype: torch.dtype | None = None):
    """The drafter saved in `directory`, whatever its method (float32 unless `dtype` says otherwise)."""
    method = drafter_method(directory)
    if method in ("eagle3", "eagle3.1"):
        from draftsync.speculative.speculators_format import load_eagle3

        return load_eagle3(directory, dtype)
    if method == "eagle":
        from draftsync.speculative.eagle1_format import load_eagle

        return load_eagle(directory, dtype)
    if method == "draft_model":
        from draftsync.speculative.draft_model import load_draft_model

        return load_draft_model(directory, dtype)
    from draftsync.speculative.medusa_format import load_medusa

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
