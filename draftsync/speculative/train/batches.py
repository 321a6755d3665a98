"""A training step's batches: its windows in micro-batches, each moved to the drafter's device with the target's
logits filled in from the stored final state, a chunk of tokens at a time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.data.training_batch import TrainingBatch

# Target logits computed at once while filling a batch: [tokens x vocabulary] is never whole.
TARGET_CHUNK_ELEMENTS = 1 << 25


def to_device(batch: TrainingBatch, device: torch.device) -> TrainingBatch:
    from draftsync.speculative.data.training_batch import TrainingBatch

    def move(tensor):
        return None if tensor is None else tensor.to(device, non_blocking=True)

    return TrainingBatch(
        ids=move(batch.ids),
        valid=move(batch.valid),
        loss_mask=move(batch.loss_mask),
        aux=move(batch.aux),
        final=move(batch.final),
        target_logits=move(batch.target_logits),
        target_columns=move(batch.target_columns),
        target_top=move(batch.target_top),
    )


def with_target_logits(
    batch: TrainingBatch, head: Any, temperature: float = 1.0, columns: torch.Tensor | None = None
) -> TrainingBatch:
    """Fill the target's logits (lm_head(final) / temperature), a chunk of tokens at a time.

    With `columns` (the drafter's draft vocabulary as target ids) only those columns are kept, with the target's
    greedy token over its whole vocabulary beside them: a step then never holds [tokens x vocabulary]. The logits
    keep the head's dtype: bf16 or fp16 on a GPU target, fp32 on a CPU one (and for any other dtype)."""
    import torch

    if batch.target_logits is not None:
        return batch
    final = batch.final
    weight = head.weight
    dtype = weight.dtype if weight.dtype in (torch.float32, torch.bfloat16, torch.float16) else torch.float32
    flat = final.reshape(-1, final.shape[-1])
    width = weight.shape[0] if columns is None else columns.numel()
    logits = torch.empty(flat.shape[0], width, dtype=dtype, device=final.device)
    top = torch.empty(flat.shape[0], dtype=torch.long, device=final.device)
    chunk = max(1, TARGET_CHUNK_ELEMENTS // weight.shape[0])
    with torch.no_grad():
        for begin in range(0, flat.shape[0], chunk):
            full = head(flat[begin : begin + chunk].to(weight.dtype).to(weight.device)).to(final.device)
            if columns is None:
                logits[begin : begin + chunk] = (full.float() / temperature).to(dtype)
                continue
            top[begin : begin + chunk] = full.argmax(-1)
            logits[begin : begin + chunk] = (full.index_select(-1, columns).float() / temperature).to(dtype)
    batch.target_logits = logits.reshape(*final.shape[:-1], width)
    if columns is not None:
        batch.target_columns = columns
        batch.target_top = top.reshape(final.shape[:-1])
    return batch


def draft_columns(drafter: Any, vocab_size: int, device: torch.device) -> torch.Tensor | None:
    """The target ids of a reduced draft vocabulary (None: the drafter predicts over the whole vocabulary)."""
    if drafter.d2t is None or drafter.config.draft_vocab_size >= vocab_size:
        return None
    return drafter.draft_token_ids.to(device)


def micro_batches(windows: torch.Tensor, batch_tokens: int | None) -> list[torch.Tensor]:
    """A step's windows [W, 3] in groups of at most `batch_tokens` padded tokens (count x longest window), longest
    first, so each group pads little; a window longer than the budget is a group of its own. None: one group."""
    if batch_tokens is None:
        return [windows]
    order = windows[:, 2].argsort(descending=True, stable=True)
    groups: list[list[int]] = []
    longest = 0
    for row in order.tolist():
        length = int(windows[row, 2])
        if groups and (len(groups[-1]) + 1) * longest <= batch_tokens:
            groups[-1].append(row)
            continue
        groups.append([row])
        longest = length
    return [windows[group] for group in groups]
