"""Drafter methods: the one place their names, families and the names other tools give them are written.

Every layer may import this module (tests/unit/test_layers.py lets it through): the model registry checks a drafter
version's method here, serving renders vLLM's `--speculative-config` from it, the trainer and the checkpoint
formats read their names from it. Adding a method means adding its descriptor to `_ALL`, and the code that builds,
saves, loads and proposes with it to the method registry (registry.py, which imports it when first used), not
adding a name to a tuple or an `if` in every module. No torch here: the methods' code is in the subpackages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftsync.errors import DraftsyncError

# Families: methods that share a checkpoint format, a trainer and a proposer.
EAGLE3_FAMILY = "eagle3"
EAGLE_FAMILY = "eagle"
MEDUSA_FAMILY = "medusa"
DFLASH_FAMILY = "dflash"
PEAGLE_FAMILY = "peagle"
DRAFT_MODEL_FAMILY = "draft_model"
MTP_FAMILY = "mtp"
NGRAM_FAMILY = "ngram"


@dataclass(frozen=True)
class DrafterMethod:
    """One speculative-decoding method as draftsync knows it.

    `vllm_method` is the `method` of vLLM's `--speculative-config`; `chains` is true for drafters that
    propose token by token from their own output (the EAGLE family, MTP), false for fixed heads or lookup;
    `fixed_heads` means vLLM drafts exactly one gamma at every batch size (no per-batch schedule);
    `trained` means a sync trains it from scratch for any target (the others are benchmark baselines, and the MTP
    head, which comes with its target: a sync measures it, refreshes it when stale and registers it);
    `needs_checkpoint` is false for ngram, which drafts from the prompt; `speculators_type` is the speculators
    library's name for its checkpoint format and trainer (None outside the speculators format); `reads_aux_states` means
    its dataset stores the target's auxiliary hidden states; `full_vocabulary` means it predicts through
    the target's lm_head, so it takes no reduced draft vocabulary; `drafts_block` means one forward pass drafts
    the whole proposal, up to the block its checkpoint was trained for; `gamma_limit_field` names the field of its
    config.json that bounds gamma (vLLM fails or drafts untrained positions past it), None where gamma is free;
    `parallel_drafting` means vLLM serves it with `parallel_drafting: true` (masked slots filled in one pass).
    """

    name: str
    family: str
    vllm_method: str
    chains: bool = False
    fixed_heads: bool = False
    trained: bool = True
    needs_checkpoint: bool = True
    speculators_type: str | None = None
    reads_aux_states: bool = False
    full_vocabulary: bool = False
    drafts_block: bool = False
    gamma_limit_field: str | None = None
    parallel_drafting: bool = False  # vLLM's `parallel_drafting`: an EAGLE drafter served one pass a proposal

    def __str__(self) -> str:
        return self.name


EAGLE3 = DrafterMethod(
    "eagle3", EAGLE3_FAMILY, vllm_method="eagle3", chains=True, speculators_type="eagle3", reads_aux_states=True
)
# EAGLE 3.1: EAGLE-3 with fc_norm and norm_output; vLLM reads the extra norms from an eagle3 checkpoint's config.
EAGLE3_1 = DrafterMethod(
    "eagle3.1", EAGLE3_FAMILY, vllm_method="eagle3", chains=True, speculators_type="eagle3", reads_aux_states=True
)
EAGLE = DrafterMethod("eagle", EAGLE_FAMILY, vllm_method="eagle", chains=True, full_vocabulary=True)
MEDUSA = DrafterMethod("medusa", MEDUSA_FAMILY, vllm_method="medusa", fixed_heads=True, gamma_limit_field="num_heads")
DFLASH = DrafterMethod(
    "dflash",
    DFLASH_FAMILY,
    vllm_method="dflash",
    fixed_heads=True,
    reads_aux_states=True,
    full_vocabulary=True,
    drafts_block=True,
    gamma_limit_field="max_draft_tokens",
)
# P-EAGLE: an EAGLE-3 drafter that drafts every position in one pass (masked rows after the last real one); its own
# family, since its checkpoint type, objective and proposer differ from EAGLE-3's though its layer is the same.
PEAGLE = DrafterMethod(
    "peagle",
    PEAGLE_FAMILY,
    vllm_method="eagle3",
    fixed_heads=True,
    speculators_type="peagle",
    reads_aux_states=True,
    drafts_block=True,
    gamma_limit_field="max_draft_tokens",
    parallel_drafting=True,
)
# A DFlash drafter's shape and training defaults, read by its model, the sync profile and the plan alike: the
# positions of one block (the committed token included, so it drafts block_size - 1 tokens), the most vLLM's
# buffers and the reference trainers use, its draft layers and the blocks drawn per training window.
DFLASH_BLOCK_SIZE = 8
DFLASH_MAX_BLOCK_SIZE = 16
DFLASH_LAYERS = 2
DFLASH_ANCHORS = 32
# P-EAGLE's: the depths a drafter learns by default (its proposal's longest) and the most vLLM drafts, since it
# appends num_speculative_tokens - 1 masked slots to every verified request.
PEAGLE_MAX_DRAFT_TOKENS = 6
PEAGLE_LONGEST_PROPOSAL = 16
# A MiMo-style multi-token-prediction head: one Qwen2 layer over the target's pre-norm last state (aux layer L) and
# the next token, read by the target's lm_head, its output fed back for the next step. vLLM serves it for targets
# whose config declares MTP layers (MiMoForCausalLM), from their own checkpoint or a saved head's directory.
MTP = DrafterMethod(
    "mtp", MTP_FAMILY, vllm_method="mtp", chains=True, trained=False, reads_aux_states=True, full_vocabulary=True
)
DRAFT_MODEL = DrafterMethod("draft_model", DRAFT_MODEL_FAMILY, vllm_method="draft_model", trained=False)
NGRAM = DrafterMethod("ngram", NGRAM_FAMILY, vllm_method="ngram", trained=False, needs_checkpoint=False)

_ALL = (EAGLE3, EAGLE3_1, EAGLE, MEDUSA, DFLASH, PEAGLE, MTP, DRAFT_MODEL, NGRAM)
METHODS: dict[str, DrafterMethod] = {method.name: method for method in _ALL}
# What a sync trains for any target, in the order users see them.
TRAINED_METHODS: tuple[str, ...] = tuple(method.name for method in _ALL if method.trained)
# What a drafter version may hold: a trained drafter, or a target's own MTP head (as shipped or refreshed).
REGISTERED_METHODS: tuple[str, ...] = (*TRAINED_METHODS, MTP.name)
# What vLLM can serve: every method above.
VLLM_METHODS: tuple[str, ...] = tuple(METHODS)
# What a saved drafter directory can hold (ngram has no checkpoint).
CHECKPOINT_METHODS: tuple[str, ...] = tuple(method.name for method in _ALL if method.needs_checkpoint)
DEFAULT_METHOD = EAGLE3.name


def method_named(name: str, *, among: tuple[str, ...] = VLLM_METHODS) -> DrafterMethod:
    """The descriptor of method `name`, which must be one of `among`; an unknown name is refused with the list."""
    if name not in among:
        raise DraftsyncError(f"drafter method {name!r} is unknown", f"use one of {', '.join(among)}")
    return METHODS[name]


def drafter_family(name: str) -> str | None:
    """The family of method `name`, None for a name that is no method (e.g. "none" in a recommendation)."""
    method = METHODS.get(name)
    return method.family if method is not None else None


def is_eagle3_family(name: str | None) -> bool:
    """EAGLE-3 and EAGLE 3.1: one checkpoint format, one trainer, auxiliary hidden states."""
    return name is not None and drafter_family(name) == EAGLE3_FAMILY


def eagle3_variant(fc_norm: bool, norm_output: bool) -> str:
    """The EAGLE-3 family member a drafter's norm flags make: both norms are EAGLE 3.1."""
    return EAGLE3_1.name if fc_norm and norm_output else EAGLE3.name


def needs_no_checkpoint(name: str | None) -> bool:
    """Whether method `name` drafts without a checkpoint (n-gram lookup, from the prompt); False for a name that is
    no method."""
    method = METHODS.get(name) if name is not None else None
    return method is not None and not method.needs_checkpoint


def default_mask_token(target_config: Any) -> int:
    """The token a block drafter's masked rows carry unless a profile names one: the target's pad token (its text
    rarely holds it), else the last id of its vocabulary."""
    vocab_size = int(target_config.vocab_size)
    pad = getattr(target_config, "pad_token_id", None)
    return int(pad) if isinstance(pad, int) and 0 <= pad < vocab_size else vocab_size - 1
