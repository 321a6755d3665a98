"""The P-EAGLE drafter: EAGLE-3's layer, drafting every position of a proposal in one forward pass.

What vLLM 0.32 serves with `parallel_drafting: true` (v1/spec_decode/llm_base_proposer.py, `set_inputs_first_pass`
and `_copy_and_expand_eagle_inputs`), and so what the reference engine drafts:
- the verified positions are the EAGLE-3 rows they always were: position t pairs token t+1 with the target's fused
  aux state at t; the last one (the committed token the target has not run, with the state before it) gives draft 1;
- after it, gamma - 1 masked rows at the next positions: token `mask_token_id`, and as hidden state the fused
  `mask_hidden` (a learned vector in the target's aux space, [1, 3 * target hidden], fused by `fc` as vLLM does once
  at load). Masked row i gives draft i + 2;
- attention is causal over the drafter's cache: a masked row sees every verified row and the masked rows before it;
- each row is sampled on its own (argmax at T=0); nothing drafted is fed back.

Training is that forward over whole windows: row t of depth 0 is EAGLE-3's ordinary row; row t of depth d >= 1 is a
masked row at position t + d, seeing the real rows up to t and row t of depths 1..d (EAGLE-3's training-time-test mask,
with masked inputs instead of the drafter's own guesses), and learns the target's distribution over token t + d + 2.
Every depth up to `max_draft_tokens` is trained at every step, so every gamma up to it is one the drafter learned.
The speculators trainer's masked rows see only the real context; these see what vLLM lets them see.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.training_batch import DraftLoss, TrainingBatch
from draftsync.speculative.methods import PEAGLE, PEAGLE_LONGEST_PROPOSAL, PEAGLE_MAX_DRAFT_TOKENS, default_mask_token
from draftsync.speculative.methods.eagle3.model import (
    DrafterKVCache,
    Eagle3Config,
    Eagle3Drafter,
    training_time_test_mask,
)


@dataclass
class PEagleConfig(Eagle3Config):
    """EAGLE-3's shapes and flags, the masked rows' token and how many depths the drafter learns."""

    mask_token_id: int = 0
    max_draft_tokens: int = PEAGLE_MAX_DRAFT_TOKENS

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.fc_norm or self.norm_output:
            raise DraftsyncError(
                "fc_norm or norm_output was asked of a P-EAGLE drafter",
                "leave them off: vLLM reads a P-EAGLE checkpoint's config without them (EAGLE-3's norms only)",
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DraftsyncError(
                f"P-EAGLE mask token id {self.mask_token_id} is outside the target's vocabulary "
                f"(0..{self.vocab_size - 1})",
                "choose a token id the target's embedding has, one its text rarely uses (e.g. its pad token)",
            )
        if not 1 <= self.max_draft_tokens <= PEAGLE_LONGEST_PROPOSAL:
            raise DraftsyncError(
                f"a P-EAGLE drafter of {self.max_draft_tokens} draft tokens",
                f"choose max_draft_tokens between 1 and {PEAGLE_LONGEST_PROPOSAL}",
            )

    @classmethod
    def for_target(
        cls,
        target_config: Any,
        draft_vocab_size: int | None = None,
        aux_layer_ids: tuple[int, ...] | list[int] | None = None,
        **flags: Any,
    ) -> PEagleConfig:
        """EAGLE-3's drafter for `target_config`; the mask token is the target's pad token (else its last id) unless
        `mask_token_id` is given."""
        flags.setdefault("mask_token_id", default_mask_token(target_config))
        config = super().for_target(target_config, draft_vocab_size, aux_layer_ids, **flags)
        assert isinstance(config, PEagleConfig)
        return config


class PEagleDrafter(Eagle3Drafter):
    """EAGLE-3 plus `mask_hidden`; see the module docstring for the computation."""

    config: PEagleConfig
    method = PEAGLE.name  # one method, whatever its norm flags

    def __init__(self, config: PEagleConfig):
        super().__init__(config)
        aux_width = len(config.aux_layer_ids) * config.target_hidden_size
        self.mask_hidden = nn.Parameter(0.02 * torch.randn(1, aux_width))

    @property
    def fixed_positions(self) -> int:  # type: ignore[override]
        """A proposal drafts up to the depths it was trained for."""
        return self.config.max_draft_tokens

    def mask_state(self, dtype: torch.dtype) -> torch.Tensor:
        """[1, 1, H]: the hidden state of every masked row, `mask_hidden` fused as the target's states are."""
        return self.fuse(self.mask_hidden.to(dtype))[None]

    # ---- drafting ---------------------------------------------------------------------------------
    def draft(
        self, ids: torch.Tensor, aux: torch.Tensor, position: int, gamma: int, cache: DrafterKVCache
    ) -> torch.Tensor:
        """Logits [gamma, Dv] of one proposal: verified rows `ids` [n] with aux states [n, n_aux*Ht] at positions
        position..position+n-1 go into `cache`, then gamma - 1 masked rows follow them; the cache keeps the verified
        rows only."""
        hidden = self.fuse(aux.to(self.fc.weight.dtype)[None])
        end = position + ids.shape[0]
        logits, _ = self(ids[None], hidden, torch.arange(position, end), cache)
        rows = [logits[0, -1:]]
        if gamma > 1:
            masked = torch.full((1, gamma - 1), self.config.mask_token_id, dtype=ids.dtype)
            state = self.mask_state(hidden.dtype).expand(1, gamma - 1, -1)
            mask_logits, _ = self(masked, state, torch.arange(end, end + gamma - 1), cache)
            rows.append(mask_logits[0])
        cache.crop(end)
        return torch.cat(rows)

    # ---- training ---------------------------------------------------------------------------------
    def unroll(
        self, input_ids: torch.Tensor, aux: torch.Tensor, ttt_steps: int, feed_target_states: bool = False
    ) -> list[torch.Tensor]:
        """Logits of depths 0..ttt_steps-1 over whole windows: depth 0 EAGLE-3's rows, depth d masked rows at t + d
        (module docstring). Depths do not feed each other: each is the same masked input wherever it stands."""
        if feed_target_states:
            raise DraftsyncError(
                "ttt_feed=target was asked of a P-EAGLE drafter, whose masked rows read no state but mask_hidden",
                "use ttt_feed=drafter",
            )
        batch, length = input_ids.shape
        positions = torch.arange(length, device=input_ids.device)
        fused = self.fuse(aux)
        masked_ids = torch.full_like(input_ids, self.config.mask_token_id)
        masked_state = self.mask_state(fused.dtype).expand(batch, length, -1)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        logits_per_depth = []
        for depth in range(ttt_steps):
            ids, hidden = (input_ids, fused) if depth == 0 else (masked_ids, masked_state)
            past = None if depth == 0 else (torch.cat(keys, 2), torch.cat(values, 2))
            mask = training_time_test_mask(length, depth, input_ids.device, self.config.sliding_window)
            layer_inputs = (self.embed_tokens(ids), hidden, self._rope(positions + depth, hidden.dtype), past, mask)
            if self.activation_checkpointing and torch.is_grad_enabled():
                out, k, v = checkpoint(self.layers[0], *layer_inputs, use_reentrant=False)
            else:
                out, k, v = self.layers[0](*layer_inputs)
            keys.append(k)
            values.append(v)
            logits_per_depth.append(self._head(out)[0])
        return logits_per_depth

    def training_loss(
        self,
        batch: TrainingBatch,
        ttt_steps: int = 1,
        noise_std: float = 0.0,
        generator: torch.Generator | None = None,
        feed_target_states: bool = False,
    ) -> DraftLoss:
        """EAGLE-3's soft cross-entropy at every depth up to `max_draft_tokens`: depth d of row t against the target's
        distribution over token t + d + 2. `ttt_steps` does not apply (the depths are the drafter's own); noise of
        std `noise_std` on the aux states reaches the real rows only, as serving's masked rows read no state."""
        return super().training_loss(
            batch, self.config.max_draft_tokens, noise_std, generator, feed_target_states=feed_target_states
        )


def new_peagle(
    target_config: Any,
    draft_vocab_size: int | None = None,
    aux_layer_ids: tuple[int, ...] | list[int] | None = None,
    **options: Any,
) -> PEagleDrafter:
    """A fresh P-EAGLE drafter for a target with `target_config` (options: norm_before_residual, norm_before_fc,
    mask_token_id, max_draft_tokens)."""
    return PEagleDrafter(PEagleConfig.for_target(target_config, draft_vocab_size, aux_layer_ids, **options))
