"""The MTP head: one Qwen2 decoder layer over proj(norm(target state) ++ norm(next token's embedding)).

The computation is what vLLM's `mtp` method runs for a MiMo target (`MiMoMTP` in
vllm/model_executor/models/mimo_mtp.py, driven by the proposer in vllm/v1/spec_decode/llm_base_proposer.py):
- the input state is the target's last hidden state *before* its final norm (MiMo's model returns hidden + residual
  and normalises only for its logits): draftsync's aux layer L (the number of target layers);
- the token embedding (the target's) is zeroed at position 0, then `token_layernorm`; the state goes through
  `hidden_layernorm`; `input_proj` (2H -> H, no bias) reads the state *first*, then the embedding;
- one Qwen2 decoder layer (input_layernorm, rotary attention with q/k/v bias, post_attention_layernorm, SwiGLU MLP,
  both residuals), then `final_layernorm`; the target's lm_head reads that, with no other norm;
- the `final_layernorm` output is also the state fed back for the next draft step, which runs the same layer again
  one position further (vLLM reuses its one MTP layer for every step).
Parameter names are those of the checkpoint vLLM loads (`model.mtp_layers.0.*`, `model.embed_tokens.weight`,
`lm_head.weight`), so the state dict is saved as it is (checkpoint.py).

Alignment (vLLM's shift, as for EAGLE): row t pairs the target's state at t with token t+1, at position t, and
predicts token t+2; draft step s feeds row t the head's own step s-1 output with token t+s+1, at position t+s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.training_batch import DraftLoss, TrainingBatch
from draftsync.speculative.methods import EAGLE3, MTP
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
from draftsync.speculative.methods.loss import check_window, distribution_terms, gaussian_noise


@dataclass
class MtpConfig(DraftLayerConfig):
    """Shapes of an MTP head: one layer shaped like the target's own, over its whole vocabulary.

    `num_target_layers` (L) is the target's decoder depth: the head reads aux layer L, its pre-norm last state.
    """

    num_target_layers: int = 0

    def __post_init__(self) -> None:
        if self.num_target_layers < 1:
            raise DraftsyncError(
                f"an MTP head was configured for a target of {self.num_target_layers} layers",
                "build it with MtpConfig.for_target(target_config): it reads the target's last layer",
            )
        if self.target_hidden_size != self.hidden_size:
            raise DraftsyncError(
                f"MTP hidden size {self.hidden_size} differs from the target's {self.target_hidden_size}",
                "size the MTP head like the target (its input_proj maps 2H to H of the target's H)",
            )
        if self.draft_vocab_size != self.vocab_size:
            raise DraftsyncError(
                f"MTP draft vocabulary {self.draft_vocab_size} is not the target's whole vocabulary "
                f"({self.vocab_size})",
                f"leave draft_vocab_size unset for method {MTP.name!r} (vLLM reads it through the target's lm_head); "
                f"use {EAGLE3} for a reduced draft vocabulary",
            )
        if self.head_dim * self.num_attention_heads != self.hidden_size:
            raise DraftsyncError(
                f"the MTP layer's head_dim {self.head_dim} x {self.num_attention_heads} heads is not its hidden size "
                f"{self.hidden_size}",
                "use a target whose head_dim is hidden_size / num_attention_heads: vLLM's Qwen2 layer sizes its "
                "heads so",
            )

    @classmethod
    def for_target(cls, target_config: Any) -> MtpConfig:
        """A head shaped like one decoder layer of `target_config` (a transformers Qwen2 or Llama config)."""
        activation = getattr(target_config, "hidden_act", "silu")
        if activation != "silu":
            raise DraftsyncError(
                f"the target's MLP activation is {activation!r}; an MTP head's SwiGLU MLP uses silu",
                f"use method {MTP.name!r} with a target whose hidden_act is silu (Qwen2, MiMo)",
            )
        return cls(
            **llama_layer_shape(target_config),
            draft_vocab_size=target_config.vocab_size,
            num_target_layers=int(target_config.num_hidden_layers),
        )


class MtpLayer(nn.Module):
    """One MTP layer: the two input norms, input_proj, a Qwen2 decoder layer and final_layernorm."""

    def __init__(self, config: MtpConfig):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.token_layernorm = RMSNorm(hidden, eps)
        self.hidden_layernorm = RMSNorm(hidden, eps)
        self.input_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Eagle3Attention(config, input_size=hidden, qkv_bias=True)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = Eagle3MLP(config)
        self.final_layernorm = RMSNorm(hidden, eps)

    def forward(self, embeds, hidden, positions, rope, past, mask):
        # The embedding at position 0 is zeroed (vLLM's rule: the first position has no previous token to pair).
        embeds = embeds.masked_fill(positions[:, None] == 0, 0.0)
        x = self.input_proj(torch.cat([self.hidden_layernorm(hidden), self.token_layernorm(embeds)], dim=-1))
        attn, k, v = self.self_attn(self.input_layernorm(x), rope, past, mask)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return self.final_layernorm(x), k, v


class MtpModel(nn.Module):
    """The `model.` part of the checkpoint: the target's embedding and the MTP layer (one)."""

    def __init__(self, config: MtpConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.mtp_layers = nn.ModuleList([MtpLayer(config)])


class MtpHead(nn.Module):
    """MiMo-style MTP draft head; see the module docstring for the computation and the names."""

    method = MTP.name
    target_states = "aux"  # one aux state: layer L, the target's pre-norm last state
    target_copy_names = ("model.embed_tokens.weight", "lm_head.weight")  # frozen copies of the target's
    fixed_positions: int | None = None  # a chain: it drafts as many positions as it is asked
    activation_checkpointing = False  # the trainer's: recompute the layer in backward instead of keeping it
    config: MtpConfig
    inv_freq: torch.Tensor  # a buffer (register_buffer)

    def __init__(self, config: MtpConfig):
        super().__init__()
        self.config = config
        self.model = MtpModel(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.d2t = None
        self.t2d = None
        inv_freq, self.rope_scaling = rope_tables(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        self.model.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """Layer L alone: the target's last layer output before its final norm."""
        return (self.config.num_target_layers,)

    @property
    def layer(self) -> MtpLayer:
        """Its one MTP layer, run at every draft step."""
        return cast(MtpLayer, self.model.mtp_layers[0])

    # ---- vocabulary (always the target's whole vocabulary) -----------------------------------------
    def set_draft_vocab(self, d2t: torch.Tensor | None, t2d: torch.Tensor | None) -> None:
        if d2t is not None or t2d is not None:
            raise DraftsyncError(
                "a draft vocabulary mapping was given to an MTP head, which predicts the whole vocabulary",
                f"use {EAGLE3} for a reduced draft vocabulary (vLLM's MTP reads the target's lm_head)",
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
                "an MTP head was asked to train its embedding",
                f"keep freeze_embeddings=True for method {MTP.name!r}: vLLM serves it with the target's own "
                "embedding and lm_head",
            )
        embed = target.get_input_embeddings().weight
        head = target.get_output_embeddings().weight
        mine = self.model.embed_tokens.weight
        if embed.shape != mine.shape or head.shape != self.lm_head.weight.shape:
            raise DraftsyncError(
                f"the target's embedding {tuple(embed.shape)} / lm_head {tuple(head.shape)} do not fit the MTP head "
                f"({tuple(mine.shape)} each)",
                f"build the head for this target (registry.new_drafter({MTP.name!r}, target.config))",
            )
        with torch.no_grad():
            mine.copy_(embed)
            self.lm_head.weight.copy_(head)

    # ---- forward ----------------------------------------------------------------------------------
    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's state at layer L is the head's input state as it is (its norm is inside the layer)."""
        return aux.to(self.lm_head.weight.dtype)

    def _rope(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(self.inv_freq, self.rope_scaling, position_ids, dtype)

    def _step(self, input_ids, hidden, positions, past, mask):
        inputs = (
            self.model.embed_tokens(input_ids),
            hidden,
            positions,
            self._rope(positions, hidden.dtype),
            past,
            mask,
        )
        if self.activation_checkpointing and torch.is_grad_enabled():
            return checkpoint(self.layer, *inputs, use_reentrant=False)
        return self.layer(*inputs)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DrafterKVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One causal pass over new positions; with `cache`, after the positions it holds (and appended to it).

        `hidden` is the target's state at layer L (`fuse(aux)`) or the head's own fed-back state; `position_ids`
        [T] are the rows' positions (the state's, as vLLM gives them). Returns logits over the whole vocabulary
        [B,T,V] and the state to feed back [B,T,H] (the final_layernorm output).
        """
        past = None if cache is None else cache.past()
        held = 0 if past is None else past[0].shape[2]
        mask = causal_mask(input_ids.shape[1], held, input_ids.device, self.config.sliding_window)
        out, k, v = self._step(input_ids, hidden, position_ids, past, mask)
        if cache is not None:
            cache.append(k, v)
        return self.lm_head(out), out

    def unroll(self, input_ids: torch.Tensor, aux: torch.Tensor, ttt_steps: int) -> list[torch.Tensor]:
        """Training-time test: `ttt_steps` chained draft steps over whole sequences, logits of each step.

        Step 0 is the ordinary pass (row t: token t+1, target state t, position t). Step s >= 1 feeds row t the
        head's own step s-1 output with the real token t+s+1, at position t+s; it attends to the real context
        (step-0 keys up to t) and to its own chain (row t of steps 1..s), as the draft chain does at inference.
        Positions count from the window's start, as every chained drafter's do. Step s's logits are compared with
        the target's distribution at t+s+1.
        """
        length = input_ids.shape[1]
        device = input_ids.device
        hidden = self.fuse(aux)
        positions = torch.arange(length, device=device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        logits_per_step = []
        ids = input_ids
        for step in range(ttt_steps):
            past = None if step == 0 else (torch.cat(keys, 2), torch.cat(values, 2))
            mask = training_time_test_mask(length, step, device, self.config.sliding_window)
            out, k, v = self._step(ids, hidden, positions + step, past, mask)
            keys.append(k)
            values.append(v)
            logits_per_step.append(self.lm_head(out))
            hidden = out
            ids = F.pad(input_ids[:, step + 1 :], (0, step + 1))  # row t: the real token t+step+2
        return logits_per_step

    # ---- training ---------------------------------------------------------------------------------
    def training_loss(
        self, batch: TrainingBatch, ttt_steps: int, noise_std: float = 0.0, generator: torch.Generator | None = None
    ) -> DraftLoss:
        """FastMTP's objective: soft cross-entropy to the target's distribution for each chained step, nothing else.

        Row t of step s predicts token t+s+2 and is compared with target_logits[:, t+s+1] over the whole vocabulary,
        weighted by loss_mask[:, t+s+2]; no regression to the target's states. The batch's aux states must be layer
        L's alone. Gaussian noise of std `noise_std` (drawn from `generator`) is added to them. The total is the sum
        over steps; `chain_terms` holds each step's loss, which the trainer's position_decay weighs (FastMTP's
        decaying step weights).
        """
        width = self.config.target_hidden_size
        if batch.aux is None or batch.aux.shape[-1] != width:
            held = "no aux states" if batch.aux is None else f"aux states {batch.aux.shape[-1]} wide"
            raise DraftsyncError(
                f"the training batch has {held}; an MTP head reads the target's layer "
                f"{self.config.num_target_layers} alone ({width} wide)",
                f"build its dataset with aux_layer_ids [{self.config.num_target_layers}] (the pre-norm last state)",
            )
        batch.filled_target_logits()  # every family's loss needs them: fail before the forward pass
        check_window(batch.ids.shape[1], ttt_steps)
        aux = batch.aux[:, :-1]
        if noise_std > 0:
            aux = aux + gaussian_noise(aux, noise_std, generator)
        logits_per_step = self.unroll(batch.ids[:, 1:], aux, ttt_steps)
        losses: list[torch.Tensor] = []
        result = DraftLoss(total=torch.zeros(()), position_losses=[], position_hits=[], position_counts=[])
        for step, logits in enumerate(logits_per_step):
            terms = distribution_terms(logits, batch, step + 1, None, self.to_target_ids)
            if terms.loss is not None:
                losses.append(terms.loss)
                result.chain_terms.append((step, terms.loss))
            result.position_losses.append(0.0 if terms.loss is None else float(terms.loss.detach()))
            result.position_hits.append(terms.hits)
            result.position_counts.append(terms.count)
        result.total = torch.stack(losses).sum()
        return result


def new_mtp(
    target_config: Any,
    draft_vocab_size: int | None = None,
    aux_layer_ids: tuple[int, ...] | list[int] | None = None,
) -> MtpHead:
    """A fresh MTP head shaped for a target with `target_config`, over its whole vocabulary, reading its layer L."""
    layers = int(target_config.num_hidden_layers)
    if draft_vocab_size not in (None, target_config.vocab_size):
        raise DraftsyncError(
            f"a draft vocabulary of {draft_vocab_size} was asked of an MTP head",
            f"leave draft_vocab_size unset for method {MTP.name!r} (vLLM's MTP predicts through the target's "
            f"lm_head, over the whole vocabulary); use {EAGLE3} for a reduced draft vocabulary",
        )
    if aux_layer_ids is not None and tuple(int(k) for k in aux_layer_ids) != (layers,):
        raise DraftsyncError(
            f"aux layer ids {list(aux_layer_ids)} were given for an MTP head, which reads layer {layers} alone",
            f"leave aux_layer_ids unset for method {MTP.name!r}, or give [{layers}] (the target's pre-norm last state)",
        )
    return MtpHead(MtpConfig.for_target(target_config))
