"""Peak memory of one EAGLE-3 or DFlash training step (`training.optimisation_step`), predicted from shapes alone.

What a step holds at its peak (in backward), from the second step on (the first has no AdamW state yet), for one
micro-batch of `tokens` (the step's other micro-batches come and go one at a time):
- the drafter's trainable weights and AdamW's two moments, in fp32 (autocast computes in bf16 from fp32 weights), and
  the frozen embedding, which is the target's own tensor in the target's dtype;
- the target's lm_head in its own dtype, which turns the stored final states into the target's distribution;
- the micro-batch: the aux and final states;
- the target's logits over the draft vocabulary only, in the head's dtype, and its greedy token ids;
- what autograd keeps for backward, per training-time-test step: the decoder layer's activations (per token a few
  hidden widths, the MLP's intermediate width, the attention's queries, keys and values; with activation
  checkpointing only the layer's inputs and keys and values, and one layer's activations while it is recomputed)
  and the draft logits the chunked loss reads; backward adds one step's gradient of those logits;
- the gradients, which backward writes while the allocator still holds the activations' memory (measured: the
  peak is their sum, on this CPU). The last step's gradients are freed before the forward pass;
- under bf16 autocast, the 16-bit copies of the trainable weights it casts once a step.

Under FSDP2 (`optimizer_shards` ranks, the drafter sharded as one unit) a rank keeps 1/n of AdamW's moments; the
weights and gradients are whole during the step's passes, which is where its peak is.

A DFlash step (`block_rows` > 0) differs in what autograd keeps: the context (every token's fused aux states and each
draft layer's keys and values of them), and per window `block_rows` rows (its anchors' blocks) through every draft
layer, each row attending to the whole window (the scores and their softmax, the keys and values repeated for
grouped-query attention), and the rows' logits over the whole vocabulary with the target's logits they are compared
with; its frozen tensors are the target's embedding and lm_head.

The loss's softmaxes are chunked (methods/loss.py: LOSS_CHUNK_ELEMENTS) and the target's full-vocabulary logits are made
a chunk of tokens at a time, so neither appears here beyond a constant. Every term is a count of elements times
bytes, so it scales to any shape; bench/train_memory.py measures the step at shapes up to Llama-3.1-8B's drafter,
in fp32 and in bf16 autocast, and prints both, which is as far as this model is to be trusted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

FP32 = 4
BF16 = 2
GiB = 1024**3


@dataclass(frozen=True)
class StepShape:
    """An EAGLE-3 drafter for a Llama-style target, or a DFlash one (`block_rows` > 0), and the batch of one step."""

    hidden: int
    vocab: int
    draft_vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    batch: int
    seq_len: int
    ttt_steps: int
    aux_layers: int = 3
    head_bytes: int = FP32  # the target lm_head's dtype: fp32 on a CPU target, bf16 or fp16 on a GPU one
    activation_bytes: int = FP32  # BF16 under bf16 autocast
    checkpointing: bool = False
    optimizer_shards: int = 1  # ranks that share AdamW's moments (FSDP2); 1: each holds them whole
    # DFlash: its draft layers (each shaped like the target's) and the block rows a window trains (anchors x
    # block_size); 0 rows: EAGLE-3's one layer over every token
    draft_layers: int = 1
    block_rows: int = 0
    # A target's own MTP head: its layer's parameters as the target's description counts them (experts, latent
    # attention and all), which its trainable share is instead of one Llama layer's; 0: not an MTP head
    head_parameters: int = 0

    @classmethod
    def for_target(
        cls, config: Any, draft_vocab: int, batch: int, seq_len: int, ttt_steps: int, **memory: Any
    ) -> StepShape:
        """From a transformers config of the target (the drafter's layer takes the target's widths); `memory`: the
        dtypes' bytes and checkpointing."""
        heads = config.num_attention_heads
        return cls(
            hidden=config.hidden_size,
            vocab=config.vocab_size,
            draft_vocab=min(draft_vocab, config.vocab_size),
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
            intermediate=config.intermediate_size,
            batch=batch,
            seq_len=seq_len,
            ttt_steps=ttt_steps,
            **memory,
        )

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def drafter_parameters(shape: StepShape) -> tuple[int, int]:
    """(trainable, frozen) parameter counts. EAGLE-3: one layer over twice the hidden width and a head over the draft
    vocabulary, the target's embedding frozen; an MTP head: `head_parameters`, beside the target's embedding;
    DFlash: `draft_layers` layers shaped like the target's (q/k norms included) over `fc` of the aux states and two
    norms, the target's embedding and lm_head frozen."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    if shape.head_parameters:  # an MTP head: its own layer, norms and projection; the target's embedding frozen
        return shape.head_parameters, shape.vocab * h
    mlp = 3 * h * shape.intermediate
    fc = shape.aux_layers * h * h
    if shape.block_rows:
        layer = h * (q + 2 * kv) + q * h + mlp + 2 * shape.head_dim + 2 * h
        return fc + shape.draft_layers * layer + 2 * h, 2 * shape.vocab * h
    attention = 2 * h * (q + 2 * kv) + q * h
    trainable = fc + attention + mlp + shape.draft_vocab * h + 4 * h
    return trainable, shape.vocab * h


def predict_step_memory(shape: StepShape) -> dict[str, int]:
    """Bytes of each part of a step's peak, and their `total`."""
    h, n, dv = shape.hidden, shape.tokens, shape.draft_vocab
    trainable, frozen = drafter_parameters(shape)
    keys = shape.kv_heads * shape.head_dim
    queries = shape.heads * shape.head_dim
    per_token = 12 * h + 4 * shape.intermediate + 2 * queries + 4 * keys
    if shape.block_rows:
        activations = _block_activations(shape, per_token)
    else:
        layer = n * per_token
        kept_per_step = n * (2 * h + 2 * keys) if shape.checkpointing else layer
        recomputed = layer if shape.checkpointing else 0
        activations = shape.ttt_steps * (kept_per_step + n * dv) + recomputed + n * dv
    parts = {
        # the frozen tensors are the target's own (its embedding; DFlash's lm_head too), in the target's dtype
        "drafter_weights": FP32 * trainable + shape.head_bytes * frozen,
        "adam_moments": 2 * FP32 * trainable // shape.optimizer_shards,
        "target_head": shape.head_bytes * shape.vocab * h,
        "batch_states": FP32 * n * (shape.aux_layers + 1) * h,
        # DFlash also gathers them at its block rows, which the loss compares its rows' logits with
        "target_logits": shape.head_bytes * (n * dv + shape.batch * shape.block_rows * shape.vocab) + 8 * n,
        "activations": shape.activation_bytes * activations,
        "gradients": FP32 * trainable,
        # autocast keeps a 16-bit copy of each trainable weight it casts, for the step
        "autocast_copies": shape.activation_bytes * trainable if shape.activation_bytes < FP32 else 0,
    }
    parts["total"] = sum(parts.values())
    return parts


def _block_activations(shape: StepShape, per_token: int) -> int:
    """Elements a DFlash step keeps for backward (module docstring); activation checkpointing does not apply."""
    h, n, keys = shape.hidden, shape.tokens, shape.kv_heads * shape.head_dim
    rows = shape.batch * shape.block_rows
    seen = shape.seq_len + shape.block_rows  # keys a row attends over: the window's context, then its block
    context = n * (shape.aux_layers * h + 2 * h + shape.draft_layers * 5 * keys)
    attention = shape.batch * shape.heads * shape.block_rows * seen * 2 + 2 * shape.batch * shape.heads * seen * (
        shape.head_dim
    )
    # the rows' logits, their sliced copy the loss reads and its gradient
    return context + shape.draft_layers * (rows * per_token + attention) + 3 * rows * shape.vocab
