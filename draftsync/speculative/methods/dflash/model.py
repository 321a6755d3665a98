"""The DFlash drafter: a block of draft tokens from one forward pass, conditioned on the target's hidden states.

The computation is vLLM's `DFlashDraftModel` (model_executor/models/qwen3_dflash.py), under its names, so what the
reference engine drafts is what vLLM drafts:
- **context**: the target's aux states of every verified position, concatenated and fused (`fc`), normed
  (`hidden_norm`), become keys and values of each draft layer directly (that layer's k/v projections, k_norm and
  rope at the position), never passing through the layers;
- **block**: the last committed token followed by `gamma` copies of `mask_token_id`, at the next positions, runs
  through the draft layers (Qwen3 layers: per-head q/k norms). Its rows attend to the whole context and to each other
  without a causal mask; row j > 0 gives the draft token at position p + j;
- the embedding and lm_head are the target's own (frozen copies, not saved: vLLM shares the target's).

Training (the block objective of the DFlash paper and of the reference trainers): anchors are drawn among the
trained positions of each window; anchor a's block is the real token at a and masks after it, its context the
target's states of positions < a; row j is compared with the target's distribution over token a + j, weighed by
exp(-(j - 1) / decay) since a later row counts only once every earlier one was accepted. Each anchor's block length
is drawn from 2..block_size, so every gamma up to block_size - 1 is one the drafter was trained at.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.draft_vocab import DraftVocabBuffers
from draftsync.speculative.data.training_batch import DraftLoss, TrainingBatch
from draftsync.speculative.methods import (
    DFLASH,
    DFLASH_ANCHORS,
    DFLASH_BLOCK_SIZE,
    DFLASH_LAYERS,
    DFLASH_MAX_BLOCK_SIZE,
    default_mask_token,
)
from draftsync.speculative.methods.eagle3.model import (
    DraftLayerConfig,
    Eagle3MLP,
    RMSNorm,
    llama_layer_shape,
    rope_cos_sin,
    rope_tables,
)
from draftsync.speculative.methods.loss import gaussian_noise, soft_cross_entropy

# Later rows weigh exp(-(j - 1) / DECAY_SCALE): measured on the test target (2 layers, 200 steps, held-out prompts),
# a scale of 2 gave acceptance 0.52 at gamma 1 and tau 1.86 at gamma 5, against 0.44 and 1.75 with 4.
DECAY_SCALE = 2.0


@dataclass
class DFlashConfig(DraftLayerConfig):
    """Shapes of a DFlash drafter; `vocab_size` is the target's, and its head covers all of it."""

    aux_layer_ids: tuple[int, ...] = field(default=(1, 2, 3))
    num_hidden_layers: int = DFLASH_LAYERS
    block_size: int = DFLASH_BLOCK_SIZE
    mask_token_id: int = 0
    anchors: int = DFLASH_ANCHORS

    def __post_init__(self) -> None:
        self.aux_layer_ids = tuple(int(k) for k in self.aux_layer_ids)
        if not self.aux_layer_ids or len(set(self.aux_layer_ids)) != len(self.aux_layer_ids):
            raise DraftsyncError(
                f"DFlash aux layer ids {list(self.aux_layer_ids)} are not distinct ids",
                "give one or more distinct target layer ids",
            )
        if min(self.aux_layer_ids) < 1:
            raise DraftsyncError(
                f"DFlash aux layer ids {list(self.aux_layer_ids)} include layer 0, the target's embedding output",
                "read layers 1 and above (vLLM's dflash_config.target_layer_ids names decoder layer outputs)",
            )
        if not 2 <= self.block_size <= DFLASH_MAX_BLOCK_SIZE:
            raise DraftsyncError(
                f"DFlash block size {self.block_size} is outside 2..{DFLASH_MAX_BLOCK_SIZE}",
                f"choose block_size between 2 (one draft token) and {DFLASH_MAX_BLOCK_SIZE}",
            )
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise DraftsyncError(
                f"DFlash mask token id {self.mask_token_id} is outside the target's vocabulary "
                f"(0..{self.vocab_size - 1})",
                "choose a token id the target's embedding has, one its text rarely uses (e.g. its pad token)",
            )
        if self.num_hidden_layers < 1 or self.anchors < 1:
            raise DraftsyncError(
                f"a DFlash drafter of {self.num_hidden_layers} layers trained on {self.anchors} blocks a window",
                "use num_hidden_layers >= 1 and anchors >= 1",
            )
        if self.draft_vocab_size != self.vocab_size:
            raise DraftsyncError(
                f"a DFlash drafter with a draft vocabulary of {self.draft_vocab_size} of {self.vocab_size} tokens",
                "leave draft_vocab_size unset: a DFlash drafter predicts through the target's own lm_head",
            )

    @property
    def max_draft_tokens(self) -> int:
        """The most tokens one block drafts: the positions after the committed one."""
        return self.block_size - 1

    @classmethod
    def for_target(
        cls,
        target_config: Any,
        aux_layer_ids: tuple[int, ...] | list[int] | None = None,
        **options: Any,
    ) -> DFlashConfig:
        """A drafter whose layers are shaped like the target's; its mask token is the target's pad token, else the
        last id of its vocabulary, unless `mask_token_id` is given."""
        from draftsync.speculative.data.hidden_states import default_aux_layer_ids, validate_aux_layer_ids

        num_layers = target_config.num_hidden_layers
        ids = validate_aux_layer_ids(
            default_aux_layer_ids(num_layers) if aux_layer_ids is None else aux_layer_ids, num_layers
        )
        shape = llama_layer_shape(target_config)
        options.setdefault("mask_token_id", default_mask_token(target_config))
        return cls(**shape, draft_vocab_size=shape["vocab_size"], aux_layer_ids=ids, **options)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["aux_layer_ids"] = list(self.aux_layer_ids)
        return data


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class DFlashAttention(nn.Module):
    """Qwen3 attention: q/k/v projections, per-head RMSNorm of q and k, rope, no causal mask of its own."""

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        hidden = config.hidden_size
        self.q_proj = nn.Linear(hidden, self.heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def keys_values(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B,T,H] -> rotated keys and values [B,kv_heads,T,head_dim]: a context row's, or a block row's own."""
        batch, length, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        return _rotate(k, *rope), v

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        context: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attend from x's rows to the context's keys followed by x's own, as `mask` [B or 1,1,T,S] allows."""
        batch, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, length, self.heads, self.head_dim)).transpose(1, 2)
        q = _rotate(q, *rope)
        k, v = self.keys_values(x, rope)
        keys, values = torch.cat([context[0], k], 2), torch.cat([context[1], v], 2)
        if self.kv_heads != self.heads:
            repeat = self.heads // self.kv_heads
            keys, values = keys.repeat_interleave(repeat, dim=1), values.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim))


class DFlashDecoderLayer(nn.Module):
    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.self_attn = DFlashAttention(config)
        self.mlp = Eagle3MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, context, mask):
        x = x + self.self_attn(self.input_layernorm(x), rope, context, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class DFlashContext:
    """A request's context in the drafter: every layer's keys and values of the verified positions."""

    def __init__(self, layers: int) -> None:
        self.keys: list[torch.Tensor | None] = [None] * layers
        self.values: list[torch.Tensor | None] = [None] * layers
        self.length = 0

    def append(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        held_k, held_v = self.keys[layer], self.values[layer]
        self.keys[layer] = keys if held_k is None else torch.cat([held_k, keys], 2)
        self.values[layer] = values if held_v is None else torch.cat([held_v, values], 2)

    def of(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer], self.values[layer]
        assert keys is not None and values is not None, "the context is filled before a block is drafted"
        return keys, values


class DFlashDrafter(DraftVocabBuffers, nn.Module):
    """DFlash draft layers; see the module docstring for the computation and the names."""

    target_states = "aux"
    target_copy_names = ("embed_tokens.weight", "lm_head.weight")  # the target's own, shared when served
    config: DFlashConfig
    inv_freq: torch.Tensor

    def __init__(self, config: DFlashConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        self.fc = nn.Linear(len(config.aux_layer_ids) * config.target_hidden_size, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, config.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashDecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.vocab_size, bias=False)
        self.register_draft_vocab()
        inv_freq, self.rope_scaling = rope_tables(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    method = DFLASH.name

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        return self.config.aux_layer_ids

    @property
    def fixed_positions(self) -> int:
        """One block drafts up to block_size - 1 positions."""
        return self.config.max_draft_tokens

    def initialise_from_target(self, target: Any, freeze_embeddings: bool = True) -> None:
        """The target's embedding and lm_head, frozen and held once (vLLM serves the target's own); its final norm."""
        from draftsync.speculative.data.hidden_states import final_norm_of

        embed, head = target.get_input_embeddings().weight, target.get_output_embeddings().weight
        if embed.shape != self.embed_tokens.weight.shape or head.shape != self.lm_head.weight.shape:
            raise DraftsyncError(
                f"the target's embedding {tuple(embed.shape)} or lm_head {tuple(head.shape)} does not fit a DFlash "
                f"drafter of hidden size {self.config.hidden_size} over {self.config.vocab_size} tokens",
                f"build the drafter for this target (registry.new_drafter({DFLASH.name!r}, target.config))",
            )
        embed.requires_grad_(False)
        head.requires_grad_(False)
        self.embed_tokens.weight = embed
        self.lm_head.weight = head
        with torch.no_grad():
            final_norm = final_norm_of(target).weight
            if final_norm.shape == self.norm.weight.shape:
                self.norm.weight.copy_(final_norm)

    # ---- forward ----------------------------------------------------------------------------------
    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(self.inv_freq, self.rope_scaling, positions, dtype)

    def context_keys_values(
        self, aux: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """[B,T,n*Ht] aux states at `positions` [T] -> each layer's context keys and values."""
        normed = self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))
        rope = self._rope(positions, normed.dtype)
        layers = cast(list[DFlashDecoderLayer], list(self.layers))
        return [layer.self_attn.keys_values(normed, rope) for layer in layers]

    def block_logits(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        context: list[tuple[torch.Tensor, torch.Tensor]],
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Block rows `ids` [B,R] at `positions` [R] over each layer's context -> logits [B,R,V]."""
        x = self.embed_tokens(ids)
        rope = self._rope(positions, x.dtype)
        for layer, keys_values in zip(self.layers, context, strict=True):
            x = layer(x, rope, keys_values, mask)
        return self.lm_head(self.norm(x))

    def new_context(self) -> DFlashContext:
        return DFlashContext(len(self.layers))

    def draft(self, aux: torch.Tensor, context: DFlashContext, last_token: int, gamma: int) -> torch.Tensor:
        """Add the verified positions' aux states [n, n_aux*Ht] to `context`, then draft `gamma` positions after
        `last_token` (at the position after the context): logits [gamma, V]."""
        start = context.length
        if aux.shape[0]:
            fresh = self.context_keys_values(aux[None], torch.arange(start, start + aux.shape[0]))
            for layer, (keys, values) in enumerate(fresh):
                context.append(layer, keys, values)
            context.length += aux.shape[0]
        end = context.length
        ids = torch.tensor([[last_token] + [self.config.mask_token_id] * gamma])
        logits = self.block_logits(
            ids, torch.arange(end, end + gamma + 1), [context.of(i) for i in range(len(self.layers))], None
        )
        return logits[0, 1:]

    # ---- training ---------------------------------------------------------------------------------
    def training_loss(
        self, batch: TrainingBatch, ttt_steps: int = 1, noise_std: float = 0.0, generator: torch.Generator | None = None
    ) -> DraftLoss:
        """The block objective (module docstring) over `config.anchors` blocks a window.

        `ttt_steps` does not apply (a block is one pass). The anchors, and Gaussian noise of std `noise_std` on the aux
        states, are drawn with `generator` (a fixed one when None, so an evaluation is repeatable).
        """
        target_logits = batch.filled_target_logits()
        if batch.aux is None:
            raise DraftsyncError(
                "the training batch has no aux states, which a DFlash drafter reads",
                "rebuild the dataset with aux states (the DFlash method's layer ids)",
            )
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        aux = batch.aux if noise_std <= 0 else batch.aux + gaussian_noise(batch.aux, noise_std, generator)
        size = self.config.block_size
        anchors, lengths, live = self._draw_anchors(batch, generator)  # [B,N], [B,N], [B,N]
        batch_size, count = anchors.shape
        offsets = torch.arange(size)
        in_block = (offsets[None, None, :] < lengths[:, :, None]) & live[:, :, None]
        logits = self.block_training_logits(batch.ids, aux, batch.valid, anchors, in_block)
        rows = (anchors[:, :, None] + offsets).clamp(max=batch.ids.shape[1] - 1)  # [B,N,S] each block row's position

        # Row j >= 1 of anchor a guesses token a + j: the target's distribution after a + j - 1.
        predicted = rows[:, :, 1:]
        weight = (
            in_block[:, :, 1:] & torch.gather(batch.loss_mask, 1, predicted.reshape(batch_size, -1)).view_as(predicted)
        ).float()
        decay = torch.exp(-(offsets[1:].float() - 1) / DECAY_SCALE)
        source = (predicted - 1).reshape(batch_size, -1)
        wanted = torch.gather(target_logits, 1, source[:, :, None].expand(-1, -1, target_logits.shape[-1]))
        wanted = wanted.view(batch_size, count, size - 1, -1)
        total = soft_cross_entropy(
            logits[:, :, 1:].reshape(batch_size, -1, logits.shape[-1]),
            wanted.reshape(batch_size, -1, wanted.shape[-1]),
            (weight * decay).reshape(batch_size, -1),
        )
        greedy = torch.gather(batch.target_greedy(), 1, source).view_as(predicted)
        hits = (logits[:, :, 1:].argmax(-1) == greedy) & weight.bool()
        result = DraftLoss(total=total, position_losses=[], position_hits=[], position_counts=[])
        with torch.no_grad():
            for j in range(size - 1):
                counted = weight[:, :, j]
                result.position_hits.append(int(hits[:, :, j].sum()))
                result.position_counts.append(int(counted.sum()))
                result.position_losses.append(
                    float(soft_cross_entropy(logits[:, :, j + 1].detach(), wanted[:, :, j], counted))
                    if counted.any()
                    else 0.0
                )
        return result

    def block_training_logits(
        self, ids: torch.Tensor, aux: torch.Tensor, valid: torch.Tensor, anchors: torch.Tensor, in_block: torch.Tensor
    ) -> torch.Tensor:
        """Logits [B,N,S,V] of N blocks a window at once: block n starts with the real token at anchors[:, n], sees
        the context before it and its own rows where `in_block` [B,N,S] (its length), as `draft` sees them."""
        batch_size, count, size = in_block.shape
        window = ids.shape[1]
        offsets = torch.arange(size)
        positions = (anchors[:, :, None] + offsets).clamp(max=window - 1).reshape(batch_size, -1)
        first = offsets[None, None, :] == 0
        block_ids = torch.where(first, torch.gather(ids, 1, anchors)[:, :, None], self.config.mask_token_id)
        context = self.context_keys_values(aux, torch.arange(window))
        mask = self._training_mask(anchors, in_block, valid)
        x = self.embed_tokens(block_ids.reshape(batch_size, -1))
        cos, sin = self._rope(positions.reshape(-1), x.dtype)  # every row at its own position
        rope = (cos.view(batch_size, 1, count * size, -1), sin.view(batch_size, 1, count * size, -1))
        for layer, keys_values in zip(self.layers, context, strict=True):
            x = layer(x, rope, keys_values, mask)
        return self.lm_head(self.norm(x)).view(batch_size, count, size, -1)

    def _draw_anchors(self, batch: TrainingBatch, generator: torch.Generator):
        """Per window, `anchors` positions a >= 1 whose next token is trained (uniformly, without replacement), and a
        block length in 2..block_size for each; `live` is False where a window has fewer such positions."""
        trainable = torch.zeros_like(batch.valid)
        trainable[:, 1:-1] = batch.valid[:, 1:-1] & batch.loss_mask[:, 2:]
        count = self.config.anchors
        scores = torch.rand(trainable.shape, generator=generator).masked_fill(~trainable, -1.0)
        picked = scores.topk(min(count, trainable.shape[1]), dim=1)
        live = picked.values >= 0
        lengths = torch.randint(2, self.config.block_size + 1, picked.indices.shape, generator=generator)
        return picked.indices, lengths, live

    def _training_mask(self, anchors: torch.Tensor, in_block: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        """[B,1,N*S,T+N*S]: block rows see the context before their anchor and the rows of their own block."""
        batch_size, count, size = in_block.shape
        window = valid.shape[1]
        sees_context = (torch.arange(window)[None, None, :] < anchors[:, :, None]) & valid[:, None, :]  # [B,N,T]
        sees_context = sees_context[:, :, None, :].expand(-1, -1, size, -1).reshape(batch_size, count * size, window)
        block = torch.arange(count).repeat_interleave(size)
        same_block = block[:, None] == block[None, :]  # [N*S,N*S]
        sees_rows = same_block[None] & in_block.reshape(batch_size, 1, count * size)
        mask = torch.cat([sees_context, sees_rows.expand(batch_size, -1, -1)], dim=2)
        mask |= torch.eye(count * size + window, dtype=torch.bool)[window:][None]  # every row sees itself
        return mask[:, None]


def new_dflash(
    target_config: Any, aux_layer_ids: tuple[int, ...] | list[int] | None = None, **options: Any
) -> DFlashDrafter:
    """A fresh DFlash drafter for a target with `target_config` (options: block_size, mask_token_id,
    num_hidden_layers, anchors)."""
    return DFlashDrafter(DFlashConfig.for_target(target_config, aux_layer_ids, **options))
