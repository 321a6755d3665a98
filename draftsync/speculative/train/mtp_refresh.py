"""Refreshing a target's own MTP head, as FastMTP does: the trunk frozen, the head's layer trained on the target's own
responses (the dataset's samples: `speculative/data/responses.generate_responses`), its states and its distribution
read from the target as each batch is drawn (online: a head's layer is
small beside the states a dataset of them would store).

The objective is the head's own (`MtpHead.training_loss`: soft cross-entropy to the target's distribution at each
chained step), so a refreshed head learns the target it now serves, not the text it was pretrained on.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from draftsync.errors import DraftsyncError
from draftsync.speculative.data.training_batch import TrainingBatch


class _TargetStates:
    """The target's states a head trains on, caught as its forward pass runs: the input of its final norm (MiMo's
    head reads that) and the norm's output."""

    def __init__(self, target: Any):
        norm = target.model.norm
        self.pre_norm: torch.Tensor | None = None
        self.final: torch.Tensor | None = None
        self.hook = norm.register_forward_hook(self._caught)

    def _caught(self, module: Any, args: tuple, output: torch.Tensor) -> None:
        self.pre_norm, self.final = args[0], output


Sample = tuple[list[int], list[int]]  # prompt + response ids, and the loss mask: 1 on the response


def _batch(target: Any, states: _TargetStates, rows: Sequence[Sample], window: int) -> TrainingBatch:
    ids = torch.zeros(len(rows), window, dtype=torch.long)
    valid = torch.zeros(len(rows), window, dtype=torch.bool)
    answer = torch.zeros(len(rows), window, dtype=torch.bool)
    for i, (tokens, mask) in enumerate(rows):
        tokens, mask = tokens[:window], mask[:window]
        ids[i, : len(tokens)] = torch.tensor(tokens)
        valid[i, : len(tokens)] = True
        answer[i, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    with torch.no_grad():
        logits = target(input_ids=ids, attention_mask=valid.long()).logits.float()
    assert states.pre_norm is not None and states.final is not None  # the forward pass has just set them
    return TrainingBatch(
        ids=ids,
        valid=valid,
        loss_mask=answer & valid,
        aux=states.pre_norm.float(),
        final=states.final.float(),
        target_logits=logits,
    )


def refresh_head(
    target: Any,
    head: Any,
    samples: Sequence[Sample],
    *,
    steps: int,
    lr: float = 1e-3,
    batch_size: int = 8,
    window: int = 128,
    ttt_steps: int = 2,
    seed: int = 0,
) -> list[float]:
    """Train `head`'s layer (its embedding and lm_head are the target's, frozen) for `steps` AdamW steps on batches
    of the target's answered `samples`; the losses, step by step."""
    if not samples:
        raise DraftsyncError("an MTP head refresh was given no samples", "answer some prompts with the target")
    if head.aux_layer_ids != (target.config.num_hidden_layers,):
        raise DraftsyncError(
            f"the MTP head reads layer {head.aux_layer_ids} of a {target.config.num_hidden_layers}-layer target",
            "refresh the head the target itself ships (read_shipped_mtp of its checkpoint)",
        )
    target.eval()
    for parameter in target.parameters():
        parameter.requires_grad_(False)
    states = _TargetStates(target)
    trained = [p for p in head.layer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    head.train()
    losses = []
    try:
        for _ in range(steps):
            batch = _batch(target, states, rng.sample(list(samples), min(batch_size, len(samples))), window)
            loss = head.training_loss(batch, ttt_steps).total
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
    finally:  # the target serves on (the reference engine, a next refresh) without the hook
        states.hook.remove()
        head.eval()
    return losses
