"""The EAGLE-3 drafter: one decoder layer over (token embedding ++ fused target hidden state).

Parameter and buffer names are those of the speculators `eagle3` checkpoint format, which vLLM loads
(`Eagle3LlamaForCausalLM`), so a state dict saved from here is served there as is. The computation
follows the same definition: `fc` fuses the three aux states of the target; the decoder layer normalises
the token embedding (`input_layernorm`) and the hidden state (`hidden_norm`), concatenates them (2H) for
the rotary attention, adds the residual (the hidden state, normalised first when `norm_before_residual`),
then a post-attention norm and a SwiGLU MLP; `norm` and `lm_head` give logits over the draft vocabulary.
The state fed back for the next draft step is the pre-norm output (post-norm when `norm_output`, EAGLE 3.1).

Alignment (the EAGLE shift): position t pairs the embedding of token t+1 with the target's state at t,
and predicts token t+2.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.draft_vocab import DraftVocabBuffers, check_draft_vocab_size
from draftsync.speculative.data.training_batch import DraftLoss, TrainingBatch
from draftsync.speculative.families import rope_scaling_of, sliding_window_of
from draftsync.speculative.methods import EAGLE3, EAGLE3_1, eagle3_variant
from draftsync.speculative.methods.loss import check_window, distribution_terms, gaussian_noise


@dataclass
class DraftLayerConfig:
    """Shape of a drafter's one Llama decoder layer, the fields EAGLE-1 and EAGLE-3 configs share (and
    `transformer_layer_config` writes); `vocab_size` is the target's, `draft_vocab_size` the head's."""

    hidden_size: int
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 2048
    # The target's rope beyond its base (rope_type "llama3", "yarn", ... and their factors); None: default rope.
    rope_scaling: dict[str, Any] | None = None
    # The target's attention window (Mistral): vLLM applies it to the drafter's layer too, so the drafter does.
    sliding_window: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def rope_parameters(self) -> dict[str, Any]:
        """The rope as transformers 5 and vLLM read it from a config (`rope_parameters`)."""
        return {"rope_type": "default", **(self.rope_scaling or {}), "rope_theta": self.rope_theta}


def rope_tables(config: DraftLayerConfig) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim/2], attention scaling) of the drafter's rope, computed by transformers from the same
    `rope_parameters` vLLM reads, so a llama3 or yarn rope is the one served."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = config.rope_parameters()
    if rope["rope_type"] == "default":
        exponents = torch.arange(0, config.head_dim, 2).float() / config.head_dim
        return 1.0 / (config.rope_theta**exponents), 1.0
    if rope["rope_type"] not in ROPE_INIT_FUNCTIONS:
        raise DraftsyncError(
            f"the drafter's rope type {rope['rope_type']!r} is not one transformers computes",
            f"use a target whose rope is one of default, {', '.join(ROPE_INIT_FUNCTIONS)}",
        )
    llama = LlamaConfig(
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rope_parameters=rope,
    )
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope["rope_type"]](llama, None)
    return inv_freq.float(), float(scaling)


@dataclass
class Eagle3Config(DraftLayerConfig):
    """Shapes and flags of an EAGLE-3 drafter; `vocab_size` is the target's, `draft_vocab_size` the head's."""

    aux_layer_ids: tuple[int, ...] = field(default=(1, 2, 3))
    # On by default, as in speculators' trainer: the residual is then the normalised fused state, whatever
    # the scale of the target's aux states. Off, the raw fused state is the residual, and the drafter
    # learns slower (held-out top-1 0.44 against 0.57 after 300 steps on the strong built-in target).
    norm_before_residual: bool = True
    fc_norm: bool = False
    norm_output: bool = False
    norm_before_fc: bool = False

    def __post_init__(self) -> None:
        self.aux_layer_ids = tuple(int(k) for k in self.aux_layer_ids)
        if len(self.aux_layer_ids) != 3 or len(set(self.aux_layer_ids)) != 3:
            raise DraftsyncError(
                f"EAGLE-3 aux layer ids {list(self.aux_layer_ids)} are not three distinct ids",
                "give exactly three distinct target layer ids (vLLM sizes the fusion layer for three)",
            )
        if self.fc_norm and self.norm_before_fc:
            raise DraftsyncError(
                "fc_norm and norm_before_fc are both set on the EAGLE-3 config",
                "choose one: fc_norm (EAGLE 3.1, one norm per aux state) or norm_before_fc (one norm over all)",
            )
        check_draft_vocab_size(self.draft_vocab_size, self.vocab_size)

    @classmethod
    def for_target(
        cls,
        target_config: Any,
        draft_vocab_size: int | None = None,
        aux_layer_ids: tuple[int, ...] | list[int] | None = None,
        **flags: Any,
    ) -> Eagle3Config:
        """A drafter shaped like one decoder layer of `target_config` (a transformers Llama config)."""
        from draftsync.speculative.data.hidden_states import default_aux_layer_ids, validate_aux_layer_ids

        num_layers = target_config.num_hidden_layers
        ids = (
            default_aux_layer_ids(num_layers)
            if aux_layer_ids is None
            else validate_aux_layer_ids(aux_layer_ids, num_layers)
        )
        return cls(
            **llama_layer_shape(target_config),
            draft_vocab_size=draft_vocab_size or target_config.vocab_size,
            aux_layer_ids=ids,
            **flags,
        )

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["aux_layer_ids"] = list(self.aux_layer_ids)
        return data


def llama_layer_shape(target_config: Any) -> dict[str, Any]:
    """DraftLayerConfig fields but draft_vocab_size, for one decoder layer of `target_config` (a transformers
    Llama config): a drafter shaped like the target's own layers."""
    heads = target_config.num_attention_heads
    as_dict = target_config.to_dict()
    return {
        "hidden_size": target_config.hidden_size,
        "target_hidden_size": target_config.hidden_size,
        "vocab_size": target_config.vocab_size,
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(target_config, "num_key_value_heads", None) or heads,
        "head_dim": getattr(target_config, "head_dim", None) or target_config.hidden_size // heads,
        "intermediate_size": target_config.intermediate_size,
        "rms_norm_eps": target_config.rms_norm_eps,
        "rope_theta": rope_theta_of(target_config),
        "max_position_embeddings": target_config.max_position_embeddings,
        "rope_scaling": rope_scaling_of(as_dict.get("rope_parameters") or as_dict.get("rope_scaling")),
        "sliding_window": sliding_window_of(as_dict),
    }


def rope_theta_of(config: Any) -> float:
    """RoPE base of a transformers config: `rope_parameters` in transformers 5, `rope_theta` before."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict) and "rope_theta" in parameters:
        return float(parameters["rope_theta"])
    return float(getattr(config, "rope_theta", 10000.0))


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_cos_sin(
    inv_freq: torch.Tensor, scaling: float, position_ids: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, head_dim] at `position_ids` [T], as a Llama layer applies them."""
    freqs = position_ids.float()[:, None] * inv_freq.float()[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scaling).to(dtype), (emb.sin() * scaling).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Eagle3Attention(nn.Module):
    """Rotary attention whose q/k/v projections read 2H inputs (embedding ++ hidden) unless told otherwise.

    `qkv_bias` gives q/k/v a bias, as a Qwen2 layer has (the MTP head's); the EAGLE layers have none."""

    def __init__(self, config: Any, input_size: int | None = None, qkv_bias: bool = False):
        super().__init__()
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        inputs = 2 * config.hidden_size if input_size is None else input_size
        self.q_proj = nn.Linear(inputs, self.heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(inputs, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(inputs, self.kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        past: tuple[torch.Tensor, torch.Tensor] | None,
        mask: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Attend from x's rows to `past` keys followed by x's own keys, as `mask` [T, S] allows.

        Returns the output and x's own rotated keys and values, for the caller to keep.
        """
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        keys, values = (k, v) if past is None else (torch.cat([past[0], k], 2), torch.cat([past[1], v], 2))
        if self.kv_heads != self.heads:
            repeat = self.heads // self.kv_heads
            keys = keys.repeat_interleave(repeat, dim=1)
            values = values.repeat_interleave(repeat, dim=1)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        out = out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim)
        return self.o_proj(out), k, v


class Eagle3MLP(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Eagle3DecoderLayer(nn.Module):
    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.norm_before_residual = config.norm_before_residual
        self.self_attn = Eagle3Attention(config)
        self.mlp = Eagle3MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, embeds, hidden, rope, past, mask):
        residual = hidden
        hidden = self.hidden_norm(hidden)
        if self.norm_before_residual:
            residual = hidden
        x = torch.cat([self.input_layernorm(embeds), hidden], dim=-1)
        attn, k, v = self.self_attn(x, rope, past, mask)
        hidden = residual + attn
        hidden = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return hidden, k, v


def causal_mask(length: int, held: int, device: torch.device, window: int | None = None) -> torch.Tensor:
    """[length, held + length] mask: new row i sees the `held` cached positions and new rows 0..i (only the last
    `window` of them, itself included, under a sliding window)."""
    rows = torch.arange(length, device=device)[:, None] + held
    cols = torch.arange(held + length, device=device)[None, :]
    mask = cols <= rows
    return mask if window is None else mask & (cols > rows - window)


def training_time_test_mask(length: int, step: int, device: torch.device, window: int | None = None) -> torch.Tensor:
    """[length, length * (step + 1)] mask of TTT step `step` over the keys of steps 0..step.

    Row t sees the real context (step-0 keys up to t, the last `window` of them under a sliding window) and its own
    chain (row t of steps 1..step).
    """
    positions = torch.arange(length, device=device)
    # Row t stands at position t + step: its window reaches back `window` positions from there.
    causal = causal_mask(length, 0, device, None if window is None else max(1, window - step))
    diagonal = positions[None, :] == positions[:, None]
    return torch.cat([causal] + [diagonal] * step, dim=1)


class DrafterKVCache:
    """The drafter's own KV cache (one layer); `crop(n)` keeps the first n positions."""

    def __init__(self) -> None:
        self._past: tuple[torch.Tensor, torch.Tensor] | None = None  # (keys, values), set and cut together

    @property
    def length(self) -> int:
        return 0 if self._past is None else self._past[0].shape[2]

    def past(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._past

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        if self._past is None:
            self._past = (keys, values)
        else:
            self._past = (torch.cat([self._past[0], keys], 2), torch.cat([self._past[1], values], 2))

    def crop(self, length: int) -> None:
        if self._past is not None and length < self.length:
            self._past = (self._past[0][:, :, :length], self._past[1][:, :, :length])


class Eagle3Drafter(DraftVocabBuffers, nn.Module):
    """EAGLE-3 draft head; see the module docstring for the computation and the names."""

    target_states = "aux"  # reads the concatenated aux states of the target
    target_copy_names = ("embed_tokens.weight",)  # a frozen copy of the target's embedding
    fixed_positions: int | None = None  # a chain: it drafts as many positions as it is asked
    config: Eagle3Config
    inv_freq: torch.Tensor  # a buffer (register_buffer)
    activation_checkpointing = False  # the trainer's: recompute the layer in backward instead of keeping it

    def __init__(self, config: Eagle3Config):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        aux_width = len(config.aux_layer_ids) * config.target_hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, hidden)
        if config.norm_before_fc:
            self.input_norm = RMSNorm(aux_width, config.rms_norm_eps)
        if config.fc_norm:
            self.fc_norm = nn.ModuleList(
                RMSNorm(config.target_hidden_size, config.rms_norm_eps) for _ in config.aux_layer_ids
            )
        self.fc = nn.Linear(aux_width, hidden, bias=False)
        self.layers = nn.ModuleList([Eagle3DecoderLayer(config)])
        self.norm = RMSNorm(hidden, config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, config.draft_vocab_size, bias=False)
        self.register_draft_vocab()
        inv_freq, self.rope_scaling = rope_tables(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)

    @property
    def method(self) -> str:
        return eagle3_variant(self.config.fc_norm, self.config.norm_output)

    @property
    def aux_layer_ids(self) -> tuple[int, ...]:
        """The target layers whose states `fuse` reads, in order."""
        return self.config.aux_layer_ids

    def new_cache(self) -> DrafterKVCache:
        """An empty KV cache of its one layer, for a request's draft chain."""
        return DrafterKVCache()

    # ---- initialisation from the target -----------------------------------------------------------
    def initialise_from_target(self, target: Any, freeze_embeddings: bool = True) -> None:
        """Copy the target's final norm and (draft-vocabulary rows of) lm_head where shapes allow. A frozen embedding
        is the target's own tensor, held once (in the target's dtype and place), not a copy beside it."""
        from draftsync.speculative.data.hidden_states import final_norm_of

        with torch.no_grad():
            embed = target.get_input_embeddings().weight
            if embed.shape == self.embed_tokens.weight.shape and freeze_embeddings:
                embed.requires_grad_(False)
                self.embed_tokens.weight = embed
            elif embed.shape == self.embed_tokens.weight.shape:
                self.embed_tokens.weight.copy_(embed)
            head = target.get_output_embeddings().weight
            if head.shape[1] == self.config.hidden_size:
                self.lm_head.weight.copy_(head[self.draft_token_ids.to(head.device)])
            final_norm = final_norm_of(target).weight
            if final_norm.shape == self.norm.weight.shape:
                self.norm.weight.copy_(final_norm)

    # ---- forward ----------------------------------------------------------------------------------
    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[B,T,3*Ht] concatenated aux states of the target -> [B,T,H] drafter hidden state."""
        if self.config.norm_before_fc:
            aux = self.input_norm(aux)
        if self.config.fc_norm:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)
            aux = torch.cat([norm(chunk) for norm, chunk in zip(self.fc_norm, chunks, strict=True)], dim=-1)
        return self.fc(aux)

    def _rope(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(self.inv_freq, self.rope_scaling, position_ids, dtype)

    def _head(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed = self.norm(hidden)
        return self.lm_head(normed), (normed if self.config.norm_output else hidden)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        cache: DrafterKVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One causal pass over new positions; with `cache`, after the positions it holds (and appended to it).

        `hidden` is the fused target state (`fuse(aux)`) or the drafter's own fed-back state.
        Returns draft-vocabulary logits [B,T,Dv] and the state to feed back [B,T,H].
        """
        past = None if cache is None else cache.past()
        held = 0 if past is None else past[0].shape[2]
        mask = causal_mask(input_ids.shape[1], held, input_ids.device, self.config.sliding_window)
        out, k, v = self.layers[0](
            self.embed_tokens(input_ids), hidden, self._rope(position_ids, hidden.dtype), past, mask
        )
        if cache is not None:
            cache.append(k, v)
        return self._head(out)

    def unroll(
        self, input_ids: torch.Tensor, aux: torch.Tensor, ttt_steps: int, feed_target_states: bool = False
    ) -> list[torch.Tensor]:
        """Training-time test: `ttt_steps` chained draft steps over whole sequences, logits of each step.

        Step 0 is the ordinary pass (row t: token t+1, target state t). Step s >= 1 feeds row t the
        drafter's own previous state with the real token t+s+1, at position t+s; it attends to the real
        context (step-0 keys up to t) and to its own chain (row t of steps 1..s), as the draft chain does
        at inference. Real tokens, not the drafter's guesses: a later draft position only counts when the
        earlier ones were accepted, i.e. equal to the target's tokens (speculators and SpecForge train so
        too; feeding guesses measured worse here). Step s's logits are compared with the target's
        distribution at t+s+1.

        `feed_target_states` feeds step s the target's own (fused) state at t+s instead of the drafter's
        prediction of it: what the drafter never has at inference, kept for the ablation that measures it.
        """
        length = input_ids.shape[1]
        device = input_ids.device
        hidden = fused = self.fuse(aux)
        positions = torch.arange(length, device=device)
        keys: list[torch.Tensor] = []
        values: list[torch.Tensor] = []
        logits_per_step = []
        ids = input_ids
        for step in range(ttt_steps):
            past = None if step == 0 else (torch.cat(keys, 2), torch.cat(values, 2))
            mask = training_time_test_mask(length, step, device, self.config.sliding_window)
            layer_inputs = (self.embed_tokens(ids), hidden, self._rope(positions + step, hidden.dtype), past, mask)
            if self.activation_checkpointing and torch.is_grad_enabled():
                out, k, v = checkpoint(self.layers[0], *layer_inputs, use_reentrant=False)
            else:
                out, k, v = self.layers[0](*layer_inputs)
            keys.append(k)
            values.append(v)
            logits, hidden = self._head(out)
            if feed_target_states:
                hidden = F.pad(fused[:, step + 1 :], (0, 0, 0, step + 1))  # row t: the target's state at t+step+1
            logits_per_step.append(logits)
            ids = F.pad(input_ids[:, step + 1 :], (0, step + 1))  # row t: token t+step+2
        return logits_per_step

    # ---- training ---------------------------------------------------------------------------------
    def training_loss(
        self,
        batch: TrainingBatch,
        ttt_steps: int,
        noise_std: float = 0.0,
        generator: torch.Generator | None = None,
        feed_target_states: bool = False,
    ) -> DraftLoss:
        """Soft cross-entropy to the target's distribution for each of `ttt_steps` chained draft steps.

        Row t of step s predicts token t+s+2 and is compared with target_logits[:, t+s+1] over the draft
        vocabulary, weighted by loss_mask[:, t+s+2]. Gaussian noise of std `noise_std` (drawn from
        `generator`) on the aux states teaches robustness to small drifts of the target. The total is the
        sum over steps; `chain_terms` holds each step's loss for a weighting by position. `feed_target_states`:
        see `unroll`.
        """
        if batch.aux is None:
            raise DraftsyncError(
                "the training batch has no aux states, which an EAGLE-3 drafter reads",
                "build the training dataset with aux states for eagle3/eagle3.1 drafters",
            )
        batch.filled_target_logits()  # every family's loss needs them: fail before the forward pass
        check_window(batch.ids.shape[1], ttt_steps)
        aux = batch.aux[:, :-1]
        if noise_std > 0:
            aux = aux + gaussian_noise(aux, noise_std, generator)
        logits_per_step = self.unroll(batch.ids[:, 1:], aux.to(self.fc.weight.dtype), ttt_steps, feed_target_states)
        draft_ids = None if self.d2t is None else self.draft_token_ids
        losses: list[torch.Tensor] = []
        result = DraftLoss(total=torch.zeros(()), position_losses=[], position_hits=[], position_counts=[])
        for step, logits in enumerate(logits_per_step):
            terms = distribution_terms(logits, batch, step + 1, draft_ids, self.to_target_ids)
            if terms.loss is not None:
                losses.append(terms.loss)
                result.chain_terms.append((step, terms.loss))
            result.position_losses.append(0.0 if terms.loss is None else float(terms.loss.detach()))
            result.position_hits.append(terms.hits)
            result.position_counts.append(terms.count)
        result.total = torch.stack(losses).sum()
        return result


def new_eagle3(
    target_config: Any,
    draft_vocab_size: int | None = None,
    aux_layer_ids: tuple[int, ...] | list[int] | None = None,
    **flags: Any,
) -> Eagle3Drafter:
    """A fresh EAGLE-3 drafter shaped for a target with `target_config`, its norm flags as given."""
    return Eagle3Drafter(Eagle3Config.for_target(target_config, draft_vocab_size, aux_layer_ids, **flags))


def new_eagle3_1(
    target_config: Any,
    draft_vocab_size: int | None = None,
    aux_layer_ids: tuple[int, ...] | list[int] | None = None,
    **flags: Any,
) -> Eagle3Drafter:
    """A fresh EAGLE 3.1 drafter: EAGLE-3 with fc_norm and norm_output, which it cannot go without."""
    if flags.get("fc_norm") is False or flags.get("norm_output") is False:
        raise DraftsyncError(
            f"an {EAGLE3_1} drafter was asked to go without fc_norm or norm_output",
            f"EAGLE 3.1 is EAGLE-3 with both: use method {EAGLE3.name!r} to choose the flags",
        )
    return new_eagle3(target_config, draft_vocab_size, aux_layer_ids, **{**flags, "fc_norm": True, "norm_output": True})
