"""Training an EAGLE-3 drafter against a frozen target, with hidden states computed on the fly.

Each batch runs the target once (no grad) for its aux states and logits; the drafter learns the target's
next-token distribution restricted to the draft vocabulary (soft cross-entropy), for one or more chained
training-time-test steps. The report's `top1_agreement` is the share of held-out positions where the
drafter's first guess equals the target's greedy token: a proxy for acceptance at T=0.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.eagle3 import Eagle3Config, Eagle3Drafter


@dataclass
class TrainConfig:
    """How to train; stops at `steps` or `time_budget_s`, whichever comes first (at least one is needed)."""

    draft_vocab_size: int | None = None  # None: the target's whole vocabulary
    aux_layer_ids: tuple[int, ...] | None = None  # None: default_aux_layer_ids(target layers)
    steps: int | None = 200
    time_budget_s: float | None = None
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup_steps: int = 10
    ttt_steps: int = 1
    noise_std: float = 0.0  # Gaussian noise added to the aux states, for robustness to the target's drift
    holdout_fraction: float = 0.05
    seed: int = 0
    fc_norm: bool = False
    norm_output: bool = False
    norm_before_fc: bool = False
    freeze_embeddings: bool = True


@dataclass
class TrainReport:
    steps: int
    tokens: int
    seconds: float
    tokens_per_s: float
    final_loss: float
    top1_agreement: float
    holdout_positions: int
    draft_vocab_size: int
    aux_layer_ids: list[int]
    losses: list[float] = field(default_factory=list)


@dataclass
class _Windows:
    """Training windows of seq_len tokens: ids, real-token flags and loss masks, all [N, seq_len]."""

    ids: Any
    valid: Any
    loss_mask: Any


def _windows(sequences: list[list[int]], loss_masks: list[list[int]] | None, seq_len: int) -> _Windows:
    import torch

    ids, valid, masks = [], [], []
    for index, sequence in enumerate(sequences):
        mask = loss_masks[index] if loss_masks is not None else [1] * len(sequence)
        for start in range(0, len(sequence), seq_len):
            chunk = sequence[start : start + seq_len]
            if len(chunk) < 3:
                continue
            pad = seq_len - len(chunk)
            ids.append(list(chunk) + [0] * pad)
            valid.append([1] * len(chunk) + [0] * pad)
            masks.append(list(mask[start : start + seq_len]) + [0] * pad)
    if not ids:
        return _Windows(torch.zeros(0, seq_len, dtype=torch.long), torch.zeros(0, seq_len, dtype=torch.bool),
                        torch.zeros(0, seq_len, dtype=torch.bool))
    return _Windows(
        torch.tensor(ids, dtype=torch.long),
        torch.tensor(valid, dtype=torch.bool),
        torch.tensor(masks, dtype=torch.bool) & torch.tensor(valid, dtype=torch.bool),
    )


def _check_inputs(target_model: Any, sequences: list[list[int]], loss_masks: list[list[int]] | None,
                  config: TrainConfig) -> None:
    if config.steps is None and config.time_budget_s is None:
        raise DraftsyncError("the training config has neither steps nor a time budget",
                             "set TrainConfig.steps or TrainConfig.time_budget_s")
    if config.ttt_steps < 1:
        raise DraftsyncError(f"ttt_steps={config.ttt_steps} is below 1", "use ttt_steps >= 1")
    if loss_masks is not None and (
        len(loss_masks) != len(sequences) or any(len(m) != len(s) for m, s in zip(loss_masks, sequences))
    ):
        raise DraftsyncError("loss masks do not line up with the token sequences",
                             "give one mask per sequence, as long as the sequence (or no masks)")
    vocab_size = target_model.config.vocab_size
    if not sequences or max((max(s) for s in sequences if s), default=-1) >= vocab_size or any(
        min(s) < 0 for s in sequences if s
    ):
        raise DraftsyncError(
            f"training sequences are empty or hold ids outside the target vocabulary (0..{vocab_size - 1})",
            "tokenize the training text with the target's own tokenizer",
        )


def _soft_cross_entropy(draft_logits, target_logits, weight):
    """Mean over weighted rows of -sum p_target * log q_draft, both over the draft vocabulary."""
    import torch

    target_probs = torch.softmax(target_logits.float(), dim=-1)
    per_row = -(target_probs * torch.log_softmax(draft_logits.float(), dim=-1)).sum(-1)
    weight = weight.float()
    return (per_row * weight).sum() / weight.sum().clamp_min(1.0)


def _warm_start(drafter: Eagle3Drafter, source: Eagle3Drafter) -> None:
    """Copy every same-shaped tensor of `source`; lm_head rows follow their target ids if the vocab moved."""
    import torch

    own = drafter.state_dict()
    with torch.no_grad():
        for name, tensor in source.state_dict().items():
            if name in ("d2t", "t2d", "lm_head.weight") or name not in own or own[name].shape != tensor.shape:
                continue
            own[name].copy_(tensor)
        if source.lm_head.weight.shape[1] == drafter.lm_head.weight.shape[1]:
            row_of = {int(t): i for i, t in enumerate(source.draft_token_ids.tolist())}
            for row, target_id in enumerate(drafter.draft_token_ids.tolist()):
                if target_id in row_of:
                    drafter.lm_head.weight[row].copy_(source.lm_head.weight[row_of[target_id]])


def _step_losses(drafter: Eagle3Drafter, states: Any, ids: Any, loss_mask: Any, ttt_steps: int, noise: Any):
    """Loss of each TTT step and the step-0 agreement counts for one batch."""
    aux = states.aux[:, :-1]
    if noise is not None:
        aux = aux + noise
    logits_per_step = drafter.unroll(ids[:, 1:], aux, ttt_steps)
    draft_ids = drafter.draft_token_ids
    length = ids.shape[1]
    losses = []
    for step, logits in enumerate(logits_per_step):
        rows = length - 2 - step  # row t predicts token t+step+2 from the target's distribution at t+step+1
        if rows <= 0:
            break
        target_logits = states.logits[:, step + 1 : step + 1 + rows].index_select(-1, draft_ids)
        losses.append(_soft_cross_entropy(logits[:, :rows], target_logits, loss_mask[:, step + 2 :]))
    first = logits_per_step[0][:, : length - 2]
    agree = (drafter.to_target_ids(first.argmax(-1)) == states.logits[:, 1 : length - 1].argmax(-1))
    weight = loss_mask[:, 2:]
    return losses, int((agree & weight).sum()), int(weight.sum())


def train_eagle3(
    target_model: Any,
    sequences: list[list[int]],
    loss_masks: list[list[int]] | None,
    config: TrainConfig,
    init_from: Eagle3Drafter | None = None,
    on_progress: Callable[[int, int | None, dict[str, float]], None] | None = None,
) -> tuple[Eagle3Drafter, TrainReport]:
    """Train an EAGLE-3 drafter for `target_model` on token `sequences`; seeded and deterministic on CPU."""
    import torch

    from draftsync.speculative.draft_vocab import build_draft_vocab, count_tokens
    from draftsync.speculative.hidden_states import capture

    _check_inputs(target_model, sequences, loss_masks, config)
    target_model.eval()
    vocab_size = target_model.config.vocab_size
    generator = torch.Generator().manual_seed(config.seed)

    order = torch.randperm(len(sequences), generator=generator).tolist()
    holdout_count = int(round(config.holdout_fraction * len(sequences))) if len(sequences) > 1 else 0
    holdout_count = min(max(holdout_count, 1 if len(sequences) > 1 else 0), len(sequences) - 1)
    held = order[:holdout_count]
    kept = order[holdout_count:]

    def select(indices):
        return [sequences[i] for i in indices], None if loss_masks is None else [loss_masks[i] for i in indices]

    train_sequences, train_masks = select(kept)
    holdout_sequences, holdout_masks = select(held) if held else select(kept)
    train = _windows(train_sequences, train_masks, config.seq_len)
    holdout = _windows(holdout_sequences, holdout_masks, config.seq_len)
    if train.ids.shape[0] == 0:
        raise DraftsyncError("no training window has 3 or more tokens", "give longer training sequences")

    drafter_config = Eagle3Config.for_target(
        target_model.config,
        draft_vocab_size=config.draft_vocab_size or vocab_size,
        aux_layer_ids=config.aux_layer_ids,
        fc_norm=config.fc_norm,
        norm_output=config.norm_output,
        norm_before_fc=config.norm_before_fc,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        drafter = Eagle3Drafter(drafter_config)
    d2t, t2d = build_draft_vocab(count_tokens(train_sequences, train_masks, vocab_size), drafter_config.draft_vocab_size)
    drafter.set_draft_vocab(d2t, t2d)
    drafter.initialise_from_target(target_model, freeze_embeddings=config.freeze_embeddings)
    if init_from is not None:
        _warm_start(drafter, init_from)
    drafter.embed_tokens.weight.requires_grad_(not config.freeze_embeddings)
    drafter.train()

    parameters = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    aux_ids = drafter_config.aux_layer_ids
    started = time.perf_counter()
    step = tokens = 0
    losses: list[float] = []
    window_order = torch.randperm(train.ids.shape[0], generator=generator)
    cursor = 0
    while True:
        elapsed = time.perf_counter() - started
        progress = max(
            0.0 if config.steps is None else (step / config.steps if config.steps > 0 else 1.0),
            0.0 if config.time_budget_s is None else elapsed / max(config.time_budget_s, 1e-9),
        )
        if progress >= 1.0:
            break
        warm = min(1.0, (step + 1) / max(1, config.warmup_steps))
        lr = config.lr * warm * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))
        for group in optimizer.param_groups:
            group["lr"] = lr

        if cursor + config.batch_size > window_order.shape[0]:
            window_order = torch.randperm(train.ids.shape[0], generator=generator)
            cursor = 0
        batch = window_order[cursor : cursor + config.batch_size]
        cursor += config.batch_size
        ids, loss_mask = train.ids[batch], train.loss_mask[batch]
        states = capture(target_model, ids, aux_ids)
        noise = None
        if config.noise_std > 0:
            noise = config.noise_std * torch.randn(states.aux[:, :-1].shape, generator=generator)
        step_losses, _, _ = _step_losses(drafter, states, ids, loss_mask, config.ttt_steps, noise)
        loss = torch.stack(step_losses).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()

        step += 1
        tokens += int(train.valid[batch].sum())
        losses.append(loss.item())
        if on_progress is not None:
            seconds = time.perf_counter() - started
            on_progress(step, config.steps, {"loss": losses[-1], "lr": lr, "tokens_per_s": tokens / max(seconds, 1e-9)})

    seconds = time.perf_counter() - started
    drafter.eval()
    agreement, positions = evaluate_top1_agreement(drafter, target_model, holdout, config.batch_size)
    report = TrainReport(
        steps=step,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / max(seconds, 1e-9),
        final_loss=sum(losses[-10:]) / max(1, len(losses[-10:])),
        top1_agreement=agreement,
        holdout_positions=positions,
        draft_vocab_size=drafter_config.draft_vocab_size,
        aux_layer_ids=list(aux_ids),
        losses=losses,
    )
    return drafter, report


def evaluate_top1_agreement(drafter: Eagle3Drafter, target_model: Any, windows: _Windows, batch_size: int) -> tuple[float, int]:
    """Share of loss-masked positions where the drafter's first guess is the target's greedy token."""
    import torch

    from draftsync.speculative.hidden_states import capture

    agree = total = 0
    with torch.no_grad():
        for start in range(0, windows.ids.shape[0], batch_size):
            ids = windows.ids[start : start + batch_size]
            mask = windows.loss_mask[start : start + batch_size]
            states = capture(target_model, ids, drafter.config.aux_layer_ids)
            _, hits, count = _step_losses(drafter, states, ids, mask, 1, None)
            agree += hits
            total += count
    return (agree / total if total else 0.0), total
