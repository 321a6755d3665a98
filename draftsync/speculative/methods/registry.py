"""The method registry: each drafter method's build, save, load and propose, behind one door.

`draftsync.speculative.methods` says what each method is (torch-free); this module carries the code that runs it,
one `MethodCode` per method, imported the first time that method is used. Callers go through the functions below and
the `Drafter` protocol (drafter.py), never through a method's name or a drafter's class:
- `new_drafter` builds a fresh drafter of a trained method, `new_drafter_to_train` the one the trainer starts from;
- `save_drafter` writes a drafter in its method's format, `drafter_method` reads which method a directory holds,
  `load_drafter` reads the drafter back;
- `make_proposer` gives the reference engine the proposer that drafts with a drafter (or with the name "ngram").

Methods and their checkpoint formats:
- the EAGLE-3 family (EAGLE-3, and EAGLE 3.1 with fc_norm and norm_output): the speculators format vLLM detects;
- EAGLE-1: the one-layer Llama layout vLLM's EAGLE method loads (eagle1/checkpoint.py);
- Medusa: the layout vLLM's Medusa method loads (medusa/checkpoint.py), plus draftsync's own keys;
- DFlash: the layout vLLM's DFlashDraftModel loads (dflash/checkpoint.py), plus draftsync's own keys;
- P-EAGLE: the speculators `peagle` format (EAGLE-3's, plus mask_hidden and the mask token; peagle/checkpoint.py);
- MTP: the MiMo layout vLLM's MTP method loads (mtp/checkpoint.py); a MiMo target's own directory holds one too.
  A sync registers a target's own head as shipped, or refreshed (speculative/train/mtp_refresh.py);
- the draft model (the benchmarks' independent small LM): a plain HF checkpoint. It is a baseline, not a
  sync method, so `new_drafter` does not build it (the trainer sizes it);
- n-gram lookup: no model and no checkpoint, a proposer only.
A directory's config.json says which one it holds, so loading needs no method name.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import (
    CHECKPOINT_METHODS,
    DFLASH,
    DRAFT_MODEL,
    EAGLE,
    EAGLE3,
    EAGLE3_1,
    MEDUSA,
    METHODS,
    MTP,
    NGRAM,
    PEAGLE,
    REGISTERED_METHODS,
    eagle3_variant,
)
from draftsync.speculative.methods.checkpoint_files import SavedFor

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.methods.drafter import Drafter
    from draftsync.speculative.methods.proposing import Proposer


@dataclass(frozen=True)
class MethodCode:
    """What runs one method; None where the method has no such step.

    - `build(target_config, draft_vocab_size, aux_layer_ids, **options)`: a fresh drafter (`new_drafter`), which takes
      `options` and no others; aux layer ids reach only a method that reads the target's aux states;
    - `build_to_train(target_config, draft_vocab_size, aux_layer_ids, medusa_heads, draft_model_parameters)`: the
      drafter the trainer starts from, with the sizes the trainer's config gives the methods that take them;
    - `save(drafter, out_dir, saved_for)` and `load(directory, dtype)`: its checkpoint format;
    - `propose(drafter)`: the proposer the reference engine drafts with; for a method without a model,
      `propose(**options)`.
    """

    options: tuple[str, ...] = ()
    build: Callable[..., Drafter] | None = None
    build_to_train: Callable[..., Drafter] | None = None
    save: Callable[[Any, str | Path, SavedFor], Path] | None = None
    load: Callable[[str | Path, torch.dtype | None], Drafter] | None = None
    propose: Callable[..., Proposer] | None = None


def _eagle3_family(build: Callable[..., Drafter], options: tuple[str, ...]) -> MethodCode:
    from draftsync.speculative.methods.eagle3.checkpoint import load_eagle3, save_eagle3
    from draftsync.speculative.methods.eagle3.proposer import ChainProposer

    return MethodCode(
        options=options,
        build=build,
        build_to_train=lambda target_config, draft_vocab_size, aux_layer_ids, medusa_heads, parameters: build(
            target_config, draft_vocab_size, aux_layer_ids
        ),
        save=save_eagle3,
        load=load_eagle3,
        propose=ChainProposer,
    )


def _eagle3() -> MethodCode:
    from draftsync.speculative.methods.eagle3.model import new_eagle3

    return _eagle3_family(new_eagle3, ("norm_before_residual", "fc_norm", "norm_output", "norm_before_fc"))


def _eagle3_1() -> MethodCode:
    from draftsync.speculative.methods.eagle3.model import new_eagle3_1

    return _eagle3_family(new_eagle3_1, ("norm_before_residual", "fc_norm", "norm_output"))


def _eagle1() -> MethodCode:
    from draftsync.speculative.methods.eagle1.checkpoint import load_eagle, save_eagle
    from draftsync.speculative.methods.eagle1.model import new_eagle
    from draftsync.speculative.methods.eagle3.proposer import ChainProposer

    return MethodCode(
        options=("feature_loss_weight", "token_loss_weight"),
        build=lambda target_config, draft_vocab_size, aux_layer_ids, **options: new_eagle(
            target_config, draft_vocab_size, **options
        ),
        build_to_train=lambda target_config, draft_vocab_size, aux_layer_ids, medusa_heads, parameters: new_eagle(
            target_config, draft_vocab_size
        ),
        save=save_eagle,
        load=load_eagle,
        propose=ChainProposer,
    )


def _medusa() -> MethodCode:
    from draftsync.speculative.methods.medusa.checkpoint import load_medusa, save_medusa
    from draftsync.speculative.methods.medusa.model import new_medusa
    from draftsync.speculative.methods.medusa.proposer import MedusaProposer

    return MethodCode(
        options=("num_heads", "num_layers", "loss_decay"),
        build=lambda target_config, draft_vocab_size, aux_layer_ids, **options: new_medusa(
            target_config, draft_vocab_size, **options
        ),
        build_to_train=lambda target_config, draft_vocab_size, aux_layer_ids, medusa_heads, parameters: new_medusa(
            target_config, draft_vocab_size, num_heads=medusa_heads
        ),
        save=save_medusa,
        load=load_medusa,
        propose=MedusaProposer,
    )


def _dflash() -> MethodCode:
    from draftsync.speculative.methods.dflash.checkpoint import load_dflash, save_dflash
    from draftsync.speculative.methods.dflash.model import new_dflash
    from draftsync.speculative.methods.dflash.proposer import BlockProposer

    def build(target_config, draft_vocab_size, aux_layer_ids, **options):
        if draft_vocab_size is not None and draft_vocab_size != target_config.vocab_size:
            raise DraftsyncError(
                f"a draft vocabulary of {draft_vocab_size} tokens was asked of a DFlash drafter",
                "leave draft_vocab_size unset: a DFlash drafter predicts through the target's own lm_head",
            )
        return new_dflash(target_config, aux_layer_ids, **options)

    return MethodCode(
        options=("block_size", "mask_token_id", "num_hidden_layers", "anchors"),
        build=build,
        build_to_train=lambda target_config, draft_vocab_size, aux_layer_ids, medusa_heads, parameters, **options: (
            build(target_config, draft_vocab_size, aux_layer_ids, **options)
        ),
        save=save_dflash,
        load=load_dflash,
        propose=BlockProposer,
    )


def _peagle() -> MethodCode:
    from draftsync.speculative.methods.peagle.checkpoint import load_peagle, save_peagle
    from draftsync.speculative.methods.peagle.model import new_peagle
    from draftsync.speculative.methods.peagle.proposer import ParallelProposer

    return MethodCode(
        options=("norm_before_residual", "norm_before_fc", "mask_token_id", "max_draft_tokens"),
        build=new_peagle,
        build_to_train=lambda target_config, draft_vocab_size, aux_layer_ids, medusa_heads, parameters, **options: (
            new_peagle(target_config, draft_vocab_size, aux_layer_ids, **options)
        ),
        save=save_peagle,
        load=load_peagle,
        propose=ParallelProposer,
    )


def _mtp() -> MethodCode:
    from draftsync.speculative.methods.mtp.checkpoint import load_mtp, save_mtp
    from draftsync.speculative.methods.mtp.model import new_mtp
    from draftsync.speculative.methods.mtp.proposer import MtpProposer

    return MethodCode(
        build=lambda target_config, draft_vocab_size, aux_layer_ids, **options: new_mtp(
            target_config, draft_vocab_size, aux_layer_ids
        ),
        build_to_train=lambda target_config, draft_vocab_size, aux_layer_ids, medusa_heads, parameters: new_mtp(
            target_config, draft_vocab_size, aux_layer_ids
        ),
        save=save_mtp,
        load=load_mtp,
        propose=MtpProposer,
    )


def _draft_model() -> MethodCode:
    from draftsync.speculative.methods.draft_model.checkpoint import load_draft_model, save_draft_model
    from draftsync.speculative.methods.draft_model.model import DraftModelDrafter
    from draftsync.speculative.methods.draft_model.proposer import DraftModelProposer

    def build_to_train(target_config, draft_vocab_size, aux_layer_ids, medusa_heads, parameters):
        # The parameter budget of an EAGLE-3 drafter's own weights unless one is given; vLLM serves a draft model
        # over the whole vocabulary, so the draft vocabulary does not apply.
        budget = parameters or parameter_count(new_drafter(EAGLE3.name, target_config)).own
        return DraftModelDrafter.for_budget(target_config, budget)

    return MethodCode(
        build_to_train=build_to_train, save=save_draft_model, load=load_draft_model, propose=DraftModelProposer
    )


def _ngram() -> MethodCode:
    from draftsync.speculative.methods.ngram.proposer import NgramProposer

    return MethodCode(propose=NgramProposer)


# Each method's code, imported when the method is first used; in the order of METHODS.
_CODE: dict[str, Callable[[], MethodCode]] = {
    EAGLE3.name: _eagle3,
    EAGLE3_1.name: _eagle3_1,
    EAGLE.name: _eagle1,
    MEDUSA.name: _medusa,
    DFLASH.name: _dflash,
    PEAGLE.name: _peagle,
    MTP.name: _mtp,
    DRAFT_MODEL.name: _draft_model,
    NGRAM.name: _ngram,
}


@functools.cache
def code_of(method: str) -> MethodCode:
    """The code of `method`, a name the registry knows (`_CODE`)."""
    return _CODE[method]()


def _check_method(method: str) -> None:
    if method not in REGISTERED_METHODS:
        raise DraftsyncError(
            f"drafter method {method!r} is unknown",
            f"use one of {', '.join(REGISTERED_METHODS)} (ngram and draft_model are benchmark baselines, not trained "
            "heads)",
        )


def _check_options(method: str, known: tuple[str, ...], options: dict[str, Any]) -> None:
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise DraftsyncError(
            f"{', '.join(unknown)} {'is not an option' if len(unknown) == 1 else 'are not options'} "
            f"of {method} drafters",
            f"use only {', '.join(known) or 'no options'} for method {method!r}",
        )


def new_drafter(
    method: str,
    target_config: Any,
    draft_vocab_size: int | None = None,
    aux_layer_ids: tuple[int, ...] | list[int] | None = None,
    **options: Any,
) -> Drafter:
    """A freshly initialised drafter of `method` shaped for a target with `target_config` (a Llama config).

    `draft_vocab_size` None means the target's whole vocabulary; `aux_layer_ids` (EAGLE-3 only) None
    means the default depths. Set the draft vocabulary and call `initialise_from_target` afterwards.
    """
    _check_method(method)
    code = code_of(method)
    _check_options(method, code.options, options)
    if aux_layer_ids is not None and not METHODS[method].reads_aux_states:
        raise DraftsyncError(
            f"aux layer ids {list(aux_layer_ids)} were given for a {method} drafter, which reads "
            "the target's final hidden state only",
            f"leave aux_layer_ids unset for method {method!r} (they apply to "
            f"{', '.join(name for name, m in METHODS.items() if m.reads_aux_states)})",
        )
    assert code.build is not None, "every trained method is built by new_drafter"
    return code.build(target_config, draft_vocab_size, aux_layer_ids, **options)


def new_drafter_to_train(
    method: str,
    target_config: Any,
    draft_vocab_size: int | None,
    aux_layer_ids: tuple[int, ...] | None,
    medusa_heads: int,
    draft_model_parameters: int | None,
    **options: Any,
) -> Drafter:
    """The drafter a training of `method` starts from, before its draft vocabulary and the target's tensors are set.

    `draft_vocab_size` None means the target's whole vocabulary; `aux_layer_ids` (the training's, else its dataset's)
    are read by the methods that read aux states. `medusa_heads` sizes a Medusa drafter; `draft_model_parameters`
    is the draft model's budget (None: the parameters of an EAGLE-3 drafter's own weights). `options` are the
    training config's settings of methods' own options (a DFlash block_size): each reaches the methods that take it,
    and None leaves a method's default.
    """
    code = code_of(method) if method in _CODE else None
    if code is None or code.build_to_train is None:
        raise DraftsyncError(
            f"unknown drafter method {method!r}",
            f"use {', '.join(REGISTERED_METHODS)} (or {DRAFT_MODEL} for the benchmark baseline)",
        )
    given = {name: value for name, value in options.items() if value is not None and name in code.options}
    return code.build_to_train(
        target_config, draft_vocab_size, aux_layer_ids, medusa_heads, draft_model_parameters, **given
    )


def save_drafter(
    drafter: Any,
    out_dir: str | Path,
    verifier_name_or_path: str,
    verifier_architectures: list[str],
    speculative_tokens: int,
) -> Path:
    """Write `drafter` in its method's format to `out_dir` and return the directory."""
    method = getattr(drafter, "method", None)
    save = code_of(method).save if method in _CODE else None
    if save is None:
        raise DraftsyncError(
            f"a drafter of method {method!r} ({type(drafter).__name__}) has no checkpoint format here",
            f"save_drafter writes {', '.join(CHECKPOINT_METHODS)} drafters",
        )
    return save(
        drafter, out_dir, SavedFor(verifier_name_or_path, tuple(verifier_architectures), int(speculative_tokens))
    )


def drafter_method(directory: str | Path) -> str:
    """The method of the drafter saved in `directory`, read from its config.json (no method's code is loaded)."""
    from draftsync.speculative.methods.checkpoint_files import read_json

    path, config = read_json(directory)
    if config.get("speculators_model_type") == PEAGLE.speculators_type:  # EAGLE-3's layout, drafted in parallel
        return PEAGLE.name
    if config.get("speculators_model_type") == EAGLE3.speculators_type:
        return eagle3_variant(bool(config.get("fc_norm")), bool(config.get("norm_output")))
    kind = config.get("draftsync_drafter")
    if kind in CHECKPOINT_METHODS and kind != EAGLE3.name:  # the EAGLE-3 family says so in its speculators type
        return kind
    from draftsync.speculative.methods.mtp.checkpoint import declares_mtp_layers

    if declares_mtp_layers(config):  # a MiMo target's own checkpoint: vLLM serves its MTP layer from there
        return MTP.name
    found = {key: config.get(key) for key in ("speculators_model_type", "draftsync_drafter", "model_type")}
    raise DraftsyncError(
        f"{path} is not the config of a drafter draftsync can read "
        f"({', '.join(f'{k}={v!r}' for k, v in found.items())})",
        f"point at a directory written by save_drafter ({', '.join(CHECKPOINT_METHODS)}); a target model's directory "
        "is not a drafter",
    )


def check_drafter_fits_target(drafter_dir: str | Path, target_dir: str | Path) -> None:
    """Refuse a drafter built for another vocabulary or hidden size than the target's (a drafter that reads the
    target's states says its width in `target_hidden_size`), from both config.json files alone, before any engine
    loads them (vLLM would start and then fail or serve garbage)."""
    from draftsync.speculative.methods.checkpoint_files import read_json

    _, config = read_json(drafter_dir)
    _, target = read_json(target_dir)
    target = target if "hidden_size" in target else target.get("text_config", target)  # a multimodal target's LM
    vocab = config.get("transformer_layer_config", {}).get("vocab_size", config.get("vocab_size"))
    for what, built_for, has, unit in (
        ("vocabulary", vocab, target.get("vocab_size"), " tokens"),
        ("hidden size", config.get("target_hidden_size"), target.get("hidden_size"), ""),
    ):
        if built_for is not None and has is not None and int(built_for) != int(has):
            raise DraftsyncError(
                f"drafter {drafter_dir} was built for a {what} of {built_for}{unit}, target {target_dir} has {has}",
                "train the drafter against this target (draftsync sync)",
            )


def load_drafter(directory: str | Path, dtype: torch.dtype | None = None) -> Drafter:
    """The drafter saved in `directory`, whatever its method (float32 unless `dtype` says otherwise)."""
    load = code_of(drafter_method(directory)).load
    assert load is not None, "every method drafter_method names has a checkpoint format"
    return load(directory, dtype)


def make_proposer(drafter_or_name: Any, **options: Any) -> Proposer:
    """A proposer for a drafter object (by its `method`), for the name "ngram" (options: prompt_lookup_min,
    prompt_lookup_max), or the proposer itself when one is given."""
    if isinstance(drafter_or_name, str):
        if drafter_or_name in _CODE and not METHODS[drafter_or_name].needs_checkpoint:
            propose = code_of(drafter_or_name).propose
            assert propose is not None, "a method without a model drafts with a proposer of its own"
            return propose(**options)
        raise DraftsyncError(
            f"no proposer is named {drafter_or_name!r}",
            "name 'ngram', or pass a drafter object (load it with load_drafter)",
        )
    if options:  # a drafter's proposer takes the drafter alone: say so rather than fail with a TypeError
        raise DraftsyncError(
            f"proposer options {sorted(options)} apply to 'ngram' only", "pass a drafter object without options"
        )
    if hasattr(drafter_or_name, "propose") and hasattr(drafter_or_name, "new_state"):
        return drafter_or_name
    method = getattr(drafter_or_name, "method", None)
    if not method:
        raise DraftsyncError(
            f"{type(drafter_or_name).__name__} names no speculative method (no `method` attribute)",
            "pass an Eagle3Drafter, EagleDrafter, MedusaDrafter, MtpHead, DraftModelDrafter or a proposer",
        )
    propose = code_of(method).propose if method in _CODE else None
    if propose is None:
        raise DraftsyncError(f"drafter method {method!r} has no proposer", f"use one of {', '.join(_CODE)}")
    return propose(drafter_or_name)


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
    copies = set(drafter.target_copy_names)
    total = trainable = shared = 0
    for name, parameter in drafter.named_parameters():
        total += parameter.numel()
        trainable += parameter.numel() if parameter.requires_grad else 0
        shared += parameter.numel() if name in copies else 0
    return ParameterCount(total=total, trainable=trainable, own=total - shared)
