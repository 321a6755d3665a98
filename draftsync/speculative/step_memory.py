"""Peak memory of one EAGLE-3 training step (`training.optimisation_step`), predicted from shapes alone.

What a step holds at its peak, from the second step on (the first has no AdamW state yet):
- the drafter's weights (the frozen target embedding among them) and, for the trainable ones, AdamW's two moments;
- the target's lm_head, which turns the stored final states into the target's distribution;
- the batch: the aux and final states;
- the target's logits over its whole vocabulary, [tokens x vocabulary];
- what autograd keeps for backward (per training-time-test step, the decoder layer's activations: per token a few
  hidden widths, the MLP's intermediate width, the attention's queries, keys and values; and the loss's
  probabilities and log-probabilities over the draft vocabulary);
- the gradients, which backward writes while the allocator still holds the activations' memory (measured: the
  peak is their sum, on this CPU). The last step's gradients are freed before the forward pass.

Every term is a count of elements times bytes, so it scales to any shape; bench/train_memory.py measures the step
at shapes up to Llama-3.1-8B's drafter and prints both, which is as far as this model is to be trusted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

FP32 = 4
GiB = 1024**3


@dataclass(frozen=True)
class StepShape:
    """An EAGLE-3 drafter for a Llama-style target, and the batch of one step."""

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

    @classmethod
    def for_target(cls, config: Any, draft_vocab: int, batch: int, seq_len: int, ttt_steps: int) -> StepShape:
        """From a transformers config of the target (the drafter's layer takes the target's widths)."""
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
        )

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def drafter_parameters(shape: StepShape) -> tuple[int, int]:
    """(trainable, frozen) parameter counts: the frozen one is the target's embedding the drafter reads."""
    h, q, kv = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    attention = 2 * h * (q + 2 * kv) + q * h
    mlp = 3 * h * shape.intermediate
    trainable = shape.aux_layers * h * h + attention + mlp + shape.draft_vocab * h + 4 * h
    return trainable, shape.vocab * h


def predict_step_memory(shape: StepShape) -> dict[str, int]:
    """Bytes of each part of a step's peak (fp32 training), and their `total`."""
    h, n, dv = shape.hidden, shape.tokens, shape.draft_vocab
    trainable, frozen = drafter_parameters(shape)
    keys = shape.kv_heads * shape.head_dim
    per_ttt_step_layer = n * (12 * h + 4 * shape.intermediate + 2 * shape.heads * shape.head_dim + 4 * keys)
    per_ttt_step_loss = 3 * n * dv
    parts = {
        "drafter_weights": FP32 * (trainable + frozen),
        "adam_moments": 2 * FP32 * trainable,
        "target_head": FP32 * shape.vocab * h,
        "batch_states": FP32 * n * (shape.aux_layers + 1) * h,
        "target_logits": FP32 * n * shape.vocab,
        "activations": FP32 * shape.ttt_steps * (per_ttt_step_layer + per_ttt_step_loss),
        "gradients": FP32 * trainable,
    }
    parts["total"] = sum(parts.values())
    return parts
