"""The EAGLE-1 drafter: one Llama decoder layer over fc(token embedding ++ the target's final hidden state).

The layout is what vLLM's EAGLE method runs (`EagleLlamaForCausalLM` in
vllm/model_executor/models/llama_eagle.py, fed by the EAGLE proposer in vllm/v1/spec_decode/):
- the input state is the target's post-norm last hidden state (`final`: what its lm_head reads);
- `fc` (2H -> H, no bias) reads the token embedding *first*, then the hidden state;
- the one decoder layer has no input_layernorm (vLLM replaces it by the identity in the first layer);
  attention, post_attention_layernorm and the SwiGLU MLP are a plain Llama layer's (H inputs);
- there is no final norm: the layer's output (hidden + residual) is both what the lm_head reads and
  the state fed back for the next draft step;
- the embedding and the lm_head are the target's own: vLLM's EAGLE-1 model has no lm_head module (it is
  given the target's after loading) and skips a checkpoint's `embed_tokens` when it shares the target's.
  Both are frozen copies here, and the draft vocabulary is the whole vocabulary (no d2t).

Alignment (the EAGLE shift): row t pairs the embedding of token t+1 with the target's state at t; it
predicts the target's state at t+1 (regression) and token t+2 (through the target's lm_head).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.training_batch import DraftLoss, TrainingBatch
from draftsync.speculative.methods import EAGLE, EAGLE3, MEDUSA
from draftsync.speculative.methods.eagle3.model import (
    DrafterKVCache,
    DraftLayerConfig,
    Eagle3Attention,
    Eagle3MLP,
    RMSNorm,
    causal_mask,
    llama_layer_shape,
    rope_cos_sin,
    rope_tables,
    training_time_test_mask,
)
from draftsync.speculative.methods.loss import (
    check_window,
    distribution_terms,
    gaussian_noise,
    masked_mean,
    prediction_rows,
)

# EAGLE-1's loss weights: feature regression dominates, the token loss (through the frozen head) steers it.
FEATURE_LOSS_WEIGHT = 1.0
TOKEN_LOSS_WEIGHT = 0.1


@dataclass
class EagleConfig(DraftLayerConfig):
    """Shapes of an EAGLE-1 drafter; hidden size and vocabulary are the target's (vLLM requires both)."""

    feature_loss_weight: float = FEATURE_LOSS_WEIGHT
    token_loss_weight: float = TOKEN_LOSS_WEIGHT

    def __post_init__(self) -> None:
        if self.target_hidden_size != self.hidden_size:
            raise DraftsyncError(
                f"EAGLE-1 hidden size {self.hidden_size} differs from the target's {self.target_hidden_size}",
                "size the EAGLE-1 drafter like the target (vLLM's fc maps 2H to H of the target's H)",
            )
        if self.draft_vocab_size != self.vocab_size:
            raise DraftsyncError(
                f"EAGLE-1 draft vocabulary {self.draft_vocab_size} is not the target's whole vocabulary "
                f"({self.vocab_size})",
                f"leave draft_vocab_size unset for method {EAGLE.name!r} (vLLM's EAGLE-1 reads the target's "
                f"lm_head); use {EAGLE3} or {MEDUSA} for a reduced draft vocabulary",
            )

    @classmethod
    def for_target(cls, target_config: Any, **options: Any) -> EagleConfig:
        """A drafter shaped like one decoder layer of `target_config` (a transformers Llama config)."""
        return cls(**llama_layer_shape(target_config), draft_vocab_size=target_config.vocab_size, **options)


class EagleDecoderLayer(nn.Module):
    """A Llama decoder layer without input_layernorm: x + attn(x), then + mlp(post_attention_layernorm(.))."""

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.self_attn = Eagle3Attention(config, input_size=config.hidden_size)
        self.mlp = Eagle3MLP(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, past, mask):
        attn, k, v = self.self_attn(x, rope, past, mask)
        hidden = x + attn
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, k, v


class EagleDrafter(nn.Module):
    """EAGLE-1 draft head; see the module docstring for the computation and the names."""

    method = EAGLE.name
    target_states = "final"  # reads the target's post-norm last hidden state
    target_copy_names = ("embed_tokens.weight", "lm_head.weight")  # frozen copies of the target's
    aux_layer_ids: tuple[int, ...] = ()
    fixed_positions: int | None = None  # a chain: it drafts as many positions as it is asked
    inv_freq: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, config: EagleConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([EagleDecoderLayer(config)])
        self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False)
        self.d2t = None
        self.t2d = None
        inv_freq, self.rope_scaling = rope_tables(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    # ---- vocabulary (always the target's whole vocabulary) -----------------------------------------
    def set_draft_vocab(self, d2t: torch.Tensor | None, t2d: torch.Tensor | None) -> None:
        if d2t is not None or t2d is not None:
            raise DraftsyncError(
                "a draft vocabulary mapping was given to an EAGLE-1 drafter, which predicts the whole vocabulary",
                "use eagle3 or medusa for a reduced draft vocabulary (vLLM's EAGLE-1 reads the target's lm_head)",
            )

    @property
    def draft_token_ids(self) -> torch.Tensor:
        return torch.arange(self.config.vocab_size, device=self.lm_head.weight.device)

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids

    def new_cache(self) -> DrafterKVCache:
        """An empty KV cache of its one layer, for a request's draft chain."""
        return DrafterKVCache()

    # ---- initialisation from the target -----------------------------------------------------------
    def initialise_from_target(self, target: Any, freeze_embeddings: bool = True) -> None:
        """Copy the target's embedding and lm_head, which vLLM substitutes for them when serving."""
        if not freeze_embeddings:
            raise DraftsyncError(
                "an EAGLE-1 drafter was asked to train its embedding",
                f"keep freeze_embeddings=True for method {EAGLE.name!r}: vLLM serves it with the target's own "
                "embedding",
            )
        embed = target.get_input_embeddings().weight
        head = target.get_output_embeddings().weight
        if embed.shape != self.embed_tokens.weight.shape or head.shape != self.lm_head.weight.shape:
            raise DraftsyncError(
                f"the target's embedding {tuple(embed.shape)} / lm_head {tuple(head.shape)} do not fit the EAGLE-1 "
                f"drafter ({tuple(self.embed_tokens.weight.shape)} each)",
                f"build the drafter for this target (registry.new_drafter({EAGLE.name!r}, target.config))",
            )
        with torch.no_grad():
            self.embed_tokens.weight.copy_(embed)
            self.lm_head.weight.copy_(head)

    # ---- forward ----------------------------------------------------------------------------------
    def fuse(self, final: torch.Tensor) -> torch.Tensor:
        """The target's final state is the drafter's hidden state as it is (cast to the drafter's dtype)."""
        return final.to(self.fc.weight.dtype)

    def _rope(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(self.inv_freq, self.rope_scaling, position_ids, dtype)

    def _layer_input(self, input_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.embed_tokens(input_ids), hidden], dim=-1))

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DrafterKVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One causal pass over new positions; with `cache`, after the positions it holds (and appended to it).

        `hidden` is the target's final state (`fuse(final)`) or the drafter's own fed-back state.
        Returns logits over the whole vocabulary [B,T,V] and the state to feed back [B,T,H].
        """
        past = None if cache is None else cache.past()
        held = 0 if past is None else past[0].shape[2]
        mask = causal_mask(input_ids.shape[1], held, input_ids.device, self.config.sliding_window)
        x = self._layer_input(input_ids, hidden)
        out, k, v = self.layers[0](x, self._rope(position_ids, x.dtype), past, mask)
        if cache is not None:
            cache.append(k, v)
        return self.lm_head(out), out

    def _chain(
        self, input_ids: torch.Tensor, final: torch.Tensor, ttt_steps: int
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Logits and predicted features of each training-time-test step (see `unroll`)."""
        length = input_ids.shape[1]
        device = input_ids.device
        hidden = self.fuse(final)
        positions = torch.arange(length, device=device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        logits_per_step, features_per_step = [], []
        ids = input_ids
        for step in range(ttt_steps):
            past = None if step == 0 else (torch.cat(keys, 2), torch.cat(values, 2))
            x = self._layer_input(ids, hidden)
            mask = training_time_test_mask(length, step, device, self.config.sliding_window)
            out, k, v = self.layers[0](x, self._rope(positions + step, x.dtype), past, mask)
            keys.append(k)
            values.append(v)
            logits = self.lm_head(out)
            logits_per_step.append(logits)
            features_per_step.append(out)
            hidden = out
            ids = F.pad(input_ids[:, step + 1 :], (0, step + 1))  # row t: the real token t+step+2
        return logits_per_step, features_per_step

    def unroll(self, input_ids: torch.Tensor, final: torch.Tensor, ttt_steps: int) -> list[torch.Tensor]:
        """Training-time test: `ttt_steps` chained draft steps over whole sequences, logits of each step.

        Step 0 is the ordinary pass (row t: token t+1, target state t). Step s >= 1 feeds row t the
        drafter's own previous feature with the real token t+s+1, at position t+s (as for EAGLE-3: later
        positions only count after accepted ones); it attends to the real context (step-0 keys up to t)
        and to its own chain (row t of steps 1..s), as the draft chain does at inference. Step s's logits
        are compared with the target's distribution at t+s+1.
        """
        return self._chain(input_ids, final, ttt_steps)[0]

    # ---- training ---------------------------------------------------------------------------------
    def training_loss(
        self, batch: TrainingBatch, ttt_steps: int, noise_std: float = 0.0, generator: torch.Generator | None = None
    ) -> DraftLoss:
        """EAGLE-1's loss for each chained step: feature regression plus the token distribution.

        Row t of step s predicts the target's feature at t+s+1 (smooth L1 to `final`, mean over H) and,
        through the frozen lm_head, token t+s+2 (soft cross-entropy to target_logits[:, t+s+1]); both are
        weighted by loss_mask[:, t+s+2] and combined as feature_loss_weight * regression +
        token_loss_weight * cross-entropy. Gaussian noise of std `noise_std` (drawn from `generator`) is
        added to the input states. `position_losses` holds each step's combined loss.
        """
        batch.filled_target_logits()  # every family's loss needs them: fail before the forward pass
        length = batch.ids.shape[1]
        check_window(length, ttt_steps)
        final = batch.final[:, :-1]
        if noise_std > 0:
            final = final + gaussian_noise(final, noise_std, generator)
        logits_per_step, features_per_step = self._chain(batch.ids[:, 1:], final, ttt_steps)
        config = self.config
        losses: list[torch.Tensor] = []
        result = DraftLoss(total=torch.zeros(()), position_losses=[], position_hits=[], position_counts=[])
        for step, (logits, features) in enumerate(zip(logits_per_step, features_per_step, strict=True)):
            offset = step + 1
            terms = distribution_terms(logits, batch, offset, None, self.to_target_ids)
            if terms.loss is not None:
                rows = prediction_rows(length, offset)
                regression = F.smooth_l1_loss(
                    features[:, :rows].float(), batch.final[:, offset : offset + rows].float(), reduction="none"
                ).mean(-1)
                feature_loss = masked_mean(regression, batch.loss_mask[:, offset + 1 : offset + 1 + rows])
                combined = config.feature_loss_weight * feature_loss + config.token_loss_weight * terms.loss
                losses.append(combined)
                result.chain_terms.append((step, combined))
            result.position_losses.append(0.0 if terms.loss is None else combined.item())
            result.position_hits.append(terms.hits)
            result.position_counts.append(terms.count)
        result.total = torch.stack(losses).sum()
        return result


def new_eagle(target_config: Any, draft_vocab_size: int | None = None, **options: Any) -> EagleDrafter:
    """A fresh EAGLE-1 drafter shaped for a target with `target_config`; its vocabulary is the target's whole one."""
    if draft_vocab_size not in (None, target_config.vocab_size):
        raise DraftsyncError(
            f"a draft vocabulary of {draft_vocab_size} was asked of an EAGLE-1 drafter",
            f"leave draft_vocab_size unset for method {EAGLE.name!r} (vLLM's EAGLE-1 predicts through the "
            f"target's lm_head, over the whole vocabulary); use {EAGLE3} or {MEDUSA} for a reduced draft "
            "vocabulary",
        )
    return EagleDrafter(EagleConfig.for_target(target_config, **options))
