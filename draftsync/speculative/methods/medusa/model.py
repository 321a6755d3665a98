"""The Medusa drafter: K heads that each guess one future token from the target's final hidden state.

Head k is `num_layers` residual blocks (x + SiLU(W x + b), H -> H, zero-initialised so a head starts as
the identity) followed by its own lm_head over the draft vocabulary. This is vLLM's Medusa model
(`model_executor/models/medusa.py` with `medusa_fc_bias`), under its names (`blocks.{k}.layers.{j}.weight`
and `.bias`, `lm_heads.{k}.weight`), so what the reference engine drafts is what vLLM drafts. All K
proposals come from one state in one pass, so a draft costs no drafter steps; the price is that head k
cannot see the tokens guessed before it. A reduced draft vocabulary keeps training cheap and is stored as
EAGLE-3 stores it (`d2t`, `t2d`); checkpoint.py widens the heads to the whole vocabulary on disk.

Alignment: at row t (the target's state after token t, which already gives token t+1) head k predicts
token t+2+k.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.draft_vocab import DraftVocabBuffers, check_draft_vocab_size
from draftsync.speculative.data.training_batch import DraftLoss, TrainingBatch
from draftsync.speculative.methods import MEDUSA
from draftsync.speculative.methods.loss import check_window, distribution_terms, gaussian_noise

LOSS_DECAY = 0.8  # head k's loss weighs decay**k (the Medusa paper's), later heads being harder


@dataclass
class MedusaConfig:
    """Shapes of a Medusa drafter; `vocab_size` is the target's, `draft_vocab_size` each head's."""

    hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    num_heads: int = 3
    num_layers: int = 1
    loss_decay: float = LOSS_DECAY

    def __post_init__(self) -> None:
        if self.num_heads < 1 or self.num_layers < 1:
            raise DraftsyncError(
                f"a Medusa drafter with {self.num_heads} heads of {self.num_layers} blocks proposes nothing",
                "use num_heads >= 1 and num_layers >= 1",
            )
        check_draft_vocab_size(self.draft_vocab_size, self.vocab_size)

    @property
    def target_hidden_size(self) -> int:
        return self.hidden_size

    @classmethod
    def for_target(cls, target_config: Any, draft_vocab_size: int | None = None, **options: Any) -> MedusaConfig:
        return cls(
            hidden_size=target_config.hidden_size,
            vocab_size=target_config.vocab_size,
            draft_vocab_size=draft_vocab_size or target_config.vocab_size,
            **options,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class MedusaBlocks(nn.Module):
    """One head's residual blocks: x <- x + SiLU(W x + b), `num_layers` times."""

    def __init__(self, hidden_size: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(hidden_size, hidden_size) for _ in range(num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + F.silu(layer(x))
        return x


class MedusaDrafter(DraftVocabBuffers, nn.Module):
    """Medusa heads; see the module docstring for the computation and the names."""

    method = MEDUSA.name
    target_states = "final"  # reads the target's post-norm last hidden state
    target_copy_names: tuple[str, ...] = ()  # every head is trained
    config: MedusaConfig
    aux_layer_ids: tuple[int, ...] = ()

    def __init__(self, config: MedusaConfig):
        super().__init__()
        self.config = config
        self.blocks = nn.ModuleList(
            MedusaBlocks(config.hidden_size, config.num_layers) for _ in range(config.num_heads)
        )
        self.lm_heads = nn.ModuleList(
            nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False) for _ in range(config.num_heads)
        )
        self.register_draft_vocab()
        for parameter in self.blocks.parameters():  # every block's weight and bias
            nn.init.zeros_(parameter)
        for weight in self.lm_heads.parameters():  # each head's weight (no bias), head 0 first
            nn.init.normal_(weight, std=0.02)

    @property
    def fixed_positions(self) -> int:
        """One draft proposes one position per head."""
        return self.config.num_heads

    # ---- initialisation from the target -----------------------------------------------------------
    def initialise_from_target(self, target: Any, freeze_embeddings: bool = True) -> None:
        """Every head's lm_head starts as the target's (its draft-vocabulary rows); heads have no embedding."""
        head = target.get_output_embeddings().weight
        if head.shape[1] != self.config.hidden_size:
            raise DraftsyncError(
                f"the target's lm_head reads {head.shape[1]} features, the Medusa heads {self.config.hidden_size}",
                f"build the drafter for this target (registry.new_drafter({MEDUSA.name!r}, target.config))",
            )
        rows = head[self.draft_token_ids.to(head.device)]
        with torch.no_grad():
            for weight in self.lm_heads.parameters():
                weight.copy_(rows)

    # ---- forward ----------------------------------------------------------------------------------
    def heads(self, final: torch.Tensor) -> torch.Tensor:
        """[B,T,H] final states of the target -> [B,T,K,Dv] logits; head k guesses token t+2+k at row t."""
        final = final.to(next(self.lm_heads.parameters()).dtype)
        return torch.stack([head(block(final)) for block, head in zip(self.blocks, self.lm_heads, strict=True)], dim=2)

    def forward(self, final: torch.Tensor) -> torch.Tensor:
        return self.heads(final)

    # ---- training ---------------------------------------------------------------------------------
    def training_loss(
        self, batch: TrainingBatch, ttt_steps: int = 1, noise_std: float = 0.0, generator: torch.Generator | None = None
    ) -> DraftLoss:
        """Soft cross-entropy of each head to the target's distribution over the token it guesses.

        Head k at row t is compared with target_logits[:, t+1+k] over the draft vocabulary, weighted by
        loss_mask[:, t+2+k]; the total weighs head k by loss_decay**k. `ttt_steps` does not apply (heads
        do not chain) and is only checked; Gaussian noise of std `noise_std` (from `generator`) is added
        to the final states.
        """
        batch.filled_target_logits()  # every family's loss needs them: fail before the forward pass
        check_window(batch.ids.shape[1], ttt_steps)
        final = batch.final
        if noise_std > 0:
            final = final + gaussian_noise(final, noise_std, generator)
        logits = self.heads(final)
        draft_ids = None if self.d2t is None else self.draft_token_ids
        losses: list[torch.Tensor] = []
        result = DraftLoss(total=torch.zeros(()), position_losses=[], position_hits=[], position_counts=[])
        for k in range(self.config.num_heads):
            terms = distribution_terms(logits[:, :, k], batch, k + 1, draft_ids, self.to_target_ids)
            if terms.loss is not None:
                losses.append(self.config.loss_decay**k * terms.loss)
            result.position_losses.append(0.0 if terms.loss is None else terms.loss.item())
            result.position_hits.append(terms.hits)
            result.position_counts.append(terms.count)
        result.total = torch.stack(losses).sum()
        return result


def new_medusa(target_config: Any, draft_vocab_size: int | None = None, **options: Any) -> MedusaDrafter:
    """Fresh Medusa heads shaped for a target with `target_config` (options: num_heads, num_layers, loss_decay)."""
    return MedusaDrafter(MedusaConfig.for_target(target_config, draft_vocab_size, **options))
