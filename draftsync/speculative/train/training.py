"""Training any drafter family against a frozen target, from hidden-state shards.

The shards hold the target's states (aux layers and the post-norm final state); the target's lm_head turns
`final` into its next-token distribution on the fly, so logits are never stored. Each family brings its own
loss (`drafter.training_loss`); this loop owns what they share: the draft vocabulary from the dataset's
token counts, initialisation from the target, warm start from the previous drafter, AdamW with warmup and
cosine decay, checkpoints every N steps with an exact resume, per-position held-out accuracy (the
acceptance proxy at T=0), bf16 autocast where the hardware runs bf16 natively.

Determinism: batch k is a pure function of (seed, k), and so is the noise drawn at step k, so a run resumed
from a checkpoint takes the same steps as one that was never interrupted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.speculative.machine import trains_in_bf16
from draftsync.speculative.methods import METHODS
from draftsync.speculative.train.batches import draft_columns, micro_batches, to_device, with_target_logits
from draftsync.speculative.train.checkpoints import CHECKPOINT_FILE, dataset_identity, load_checkpoint, save_checkpoint
from draftsync.speculative.train.config import TrainConfig
from draftsync.speculative.train.data_parallel import (
    ONE_PROCESS,
    Ranks,
    Replica,
    load_optimizer_state,
    most,
    summed,
    whole_state,
)
from draftsync.speculative.train.drafters import new_drafter_for, warm_start
from draftsync.speculative.train.target_tensors import placed_for_training, released_from_target, training_head

if TYPE_CHECKING:
    import torch

    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.data.training_batch import DraftLoss, TrainingBatch
    from draftsync.speculative.methods.drafter import Drafter


@dataclass
class TrainReport:
    method: str
    steps: int
    tokens: int
    seconds: float
    tokens_per_s: float
    final_loss: float
    top1_agreement: float  # held-out accuracy of the first draft position
    position_accuracy: list[float]  # held-out accuracy per draft position
    holdout_positions: int
    draft_vocab_size: int
    resumed_from_step: int
    warm_start_tensors: int  # tensors copied from the previous drafter (0: cold start)
    world_size: int = 1  # training processes (torchrun ranks)
    resumed_world_size: int | None = None  # the world size the resumed checkpoint was written by
    trainable_held: int = 0  # trainable parameters the leader rank held in training (1/n of them under FSDP)
    losses: list[float] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)  # per-step metrics for the tracker


def _device(name: str) -> torch.device:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise DraftsyncError(
            "training was asked to run on CUDA but no CUDA device is visible",
            "run on a GPU worker or set the training device to cpu",
        )
    return torch.device(name)


def _lr_at(config: TrainConfig, step: int) -> float:
    warm = min(1.0, (step + 1) / max(1, config.warmup_steps))
    progress = step / max(1, config.steps)
    floor = config.min_lr_ratio
    return config.lr * warm * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def evaluate(
    drafter: Any, dataset: ShardDataset, windows: torch.Tensor, head: Any, batch_size: int, device: torch.device
) -> tuple[list[float], int]:
    """Held-out top-1 accuracy per draft position (loss-masked positions) and the positions counted."""
    import torch

    hits: list[int] = []
    counts: list[int] = []
    was_training = drafter.training
    drafter.eval()
    columns = draft_columns(drafter, head.weight.shape[0], device)
    with torch.no_grad():
        for batch in dataset.batches(windows, batch_size):
            batch = with_target_logits(to_device(batch, device), head, columns=columns)
            result = drafter.training_loss(batch, ttt_steps=_positions(drafter), noise_std=0.0, generator=None)
            for i, (h, c) in enumerate(zip(result.position_hits, result.position_counts, strict=True)):
                if i >= len(hits):
                    hits.append(0)
                    counts.append(0)
                hits[i] += h
                counts[i] += c
    drafter.train(was_training)
    return [h / c if c else 0.0 for h, c in zip(hits, counts, strict=True)], (counts[0] if counts else 0)


def _check_dataset(dataset: ShardDataset, target_model: Any, config: TrainConfig) -> None:
    """The states on disk must come from this target, and EAGLE-3 needs the aux states it was told to read."""
    from draftsync.speculative.targets import target_fingerprint

    built_for = dataset.manifest["target"]
    if built_for["fingerprint"] != target_fingerprint(target_model):
        raise DraftsyncError(
            f"dataset {dataset.path} was built from another target ({built_for['name_or_path'] or 'unnamed'})",
            "rebuild the dataset from this target version: its hidden states are what the drafter learns",
        )
    if METHODS[config.method].reads_aux_states:
        wanted = tuple(config.aux_layer_ids) if config.aux_layer_ids is not None else dataset.aux_layer_ids
        if not dataset.has_aux or tuple(dataset.aux_layer_ids) != wanted:
            raise DraftsyncError(
                f"dataset {dataset.path} holds aux states of layers {list(dataset.aux_layer_ids)} "
                f"(stored: {dataset.has_aux}); {config.method} was asked to read {list(wanted)}",
                "rebuild the dataset with these aux layer ids, or train with the dataset's",
            )


def _positions(drafter: Drafter) -> int:
    """How many draft positions to evaluate: those a drafter proposes at once (Medusa's heads), else a chain of
    three."""
    return 3 if drafter.fixed_positions is None else drafter.fixed_positions


def optimisation_step(
    drafter: Any,
    micro: list[TrainingBatch],
    head: Any,
    optimizer: torch.optim.Optimizer,
    parameters: list[torch.nn.Parameter],
    config: TrainConfig,
    step: int,
    autocast: Any,
    *,
    ranks: Ranks = ONE_PROCESS,
    replica: Any = None,
) -> DraftLoss:
    """One step over micro-batches, each moved to the drafter's device only when its turn comes: per micro-batch
    the target's logits (over the draft vocabulary), the drafter's loss and backward, gradients accumulated; then
    clip and AdamW.

    Each micro-batch weighs its share of the step's loss-masked tokens, so the step's loss is the one of its
    windows taken together. The whole of a step's memory is here: bench/train_memory.py measures this function.

    Under torchrun (`ranks`, `replica` the drafter behind DDP or FSDP) the micro-batches are this rank's slice of the
    global batch, and the shares are of the global batch's tokens, so the averaged gradient is the one process's. A
    sharded replica runs as many micro-batches as the busiest rank, the extra ones weighing nothing."""
    import torch

    from draftsync.speculative.data.training_batch import DraftLoss

    # the last step's gradients go before the forward pass, so they never sit beside its activations
    optimizer.zero_grad(set_to_none=True)
    device = next(drafter.parameters()).device
    columns = draft_columns(drafter, head.weight.shape[0], device)
    feed = {"feed_target_states": True} if config.ttt_feed == "target" else {}
    masked = [int(batch.loss_mask[:, 2:].sum()) for batch in micro]
    everything = sum(summed([float(sum(masked))], ranks))
    batches = sum(summed([float(len(micro))], ranks))
    combined = DraftLoss(total=torch.zeros(()), position_losses=[], position_hits=[], position_counts=[])
    rounds = most(len(micro), ranks) if replica is not None and replica.sharded else len(micro)
    for index in range(rounds):
        padding = index >= len(micro)  # only a sharded replica's: every rank gathers the weights as often
        share = 0.0 if padding else masked[index] / everything if everything else 1.0 / batches
        batch = with_target_logits(
            to_device(micro[min(index, len(micro) - 1)], device), head, config.teacher_temperature, columns
        )
        generator = torch.Generator(device=device).manual_seed(config.seed * 1_000_003 + step + 7919 * index)
        # the ranks' gradients are combined when the last micro-batch's backward runs; the others accumulate
        with nullcontext() if replica is None else replica.accumulating(index == rounds - 1):
            with autocast:
                loss_of = replica if replica is not None else drafter.training_loss
                result = loss_of(batch, config.ttt_steps, config.noise_std, generator, **feed)
            (result.weighted_total(config.position_decay) * (share * ranks.world_size)).backward()
        if padding:
            del batch, result
            continue
        combined.total = combined.total + share * float(result.total.detach())
        for position, loss in enumerate(result.position_losses):
            if position == len(combined.position_losses):
                combined.position_losses.append(0.0)
                combined.position_hits.append(0)
                combined.position_counts.append(0)
            combined.position_losses[position] += share * loss
            combined.position_hits[position] += result.position_hits[position]
            combined.position_counts[position] += result.position_counts[position]
        del batch, result
    if ranks.distributed:  # what the step reports is the global batch's, as one process reports it
        positions = len(combined.position_losses)
        flat = summed(
            [float(combined.total), *combined.position_losses, *combined.position_hits, *combined.position_counts],
            ranks,
        )
        combined.total = torch.tensor(flat[0])
        combined.position_losses = flat[1 : 1 + positions]
        combined.position_hits = [int(v) for v in flat[1 + positions : 1 + 2 * positions]]
        combined.position_counts = [int(v) for v in flat[1 + 2 * positions :]]
    torch.nn.utils.clip_grad_norm_(parameters, 1.0)
    optimizer.step()
    return combined


def fit_drafter(
    target_model: Any,
    dataset: ShardDataset,
    config: TrainConfig,
    init_from: Any = None,
    checkpoint_dir: str | Path | None = None,
    on_progress: Callable[[int, int, dict[str, float]], None] | None = None,
    ranks: Ranks = ONE_PROCESS,
) -> tuple[Any, TrainReport]:
    """Train a drafter of `config.method` for `target_model` on `dataset`; resumes from `checkpoint_dir`.

    `init_from` (the previous target version's drafter) warm-starts it when method and shapes match. Under torchrun
    (`ranks`, its process group started) each rank trains on its slice of every step's batch; the leader alone writes
    checkpoints, which resume on any world size that leaves each rank a window a step.
    """
    config.check(ranks.world_size)
    _check_dataset(dataset, target_model, config)
    run = _set_up(target_model, dataset, config, init_from, checkpoint_dir)
    _resume(run, config, ranks)
    tokens_at_start = run.tokens
    seconds = _train_steps(run, dataset, config, ranks, on_progress)
    return _finish(run, target_model, dataset, config, ranks, seconds, run.tokens - tokens_at_start)


@dataclass
class _Run:
    """One training as its steps advance: what the set-up built, the resume restored and each step moves on."""

    drafter: Any
    head: Any  # the target's lm_head, on the training device
    device: torch.device
    autocast: Any
    train_windows: torch.Tensor
    holdout_windows: torch.Tensor
    warm_tensors: int
    checkpoint_path: Path | None
    fingerprint: str
    dataset_id: str
    replica: Any = None  # the drafter behind DDP or FSDP under torchrun
    optimizer: Any = None
    parameters: list[Any] = field(default_factory=list)  # the trainable ones (a sharded replica's own shards)
    held: int = 0
    step: int = 0
    tokens: int = 0
    losses: list[float] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
    resumed_from: int = 0
    resumed_world_size: int | None = None


def _set_up(
    target_model: Any, dataset: ShardDataset, config: TrainConfig, init_from: Any, checkpoint_dir: str | Path | None
) -> _Run:
    """The drafter on the training device (warm-started from `init_from`), the target's head, the windows, and what
    a checkpoint of this run is known by."""
    import torch

    device = _device(config.device)
    bf16 = trains_in_bf16(config.precision, device)
    target_model.eval()
    head = training_head(target_model, device)  # the target's own module stays where its hooks send inputs
    train_ids, holdout_ids = dataset.split(config.holdout_fraction, config.seed)
    train_windows = dataset.windows(train_ids, config.seq_len)
    if train_windows.shape[0] == 0:
        raise DraftsyncError(
            f"dataset {dataset.path} has no training window of 3 or more tokens",
            "build the dataset from longer texts or more samples",
        )
    drafter = new_drafter_for(target_model, dataset, config)
    warm_tensors = warm_start(drafter, init_from) if init_from is not None else 0
    placed_for_training(drafter, target_model, device).train()
    drafter.activation_checkpointing = config.activation_checkpointing
    return _Run(
        drafter=drafter,
        head=head,
        device=device,
        autocast=torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext(),
        train_windows=train_windows,
        holdout_windows=dataset.windows(holdout_ids or train_ids, config.seq_len),
        warm_tensors=warm_tensors,
        checkpoint_path=Path(checkpoint_dir) / CHECKPOINT_FILE if checkpoint_dir is not None else None,
        fingerprint=config.fingerprint(warm_start=init_from is not None),
        dataset_id=dataset_identity(dataset),
    )


def _resume(run: _Run, config: TrainConfig, ranks: Ranks) -> None:
    """The drafter behind its replica and its optimiser, both as this run's checkpoint left them, if it has one."""
    import torch

    state = load_checkpoint(run.checkpoint_path, run.fingerprint, run.dataset_id) if run.checkpoint_path else None
    if state is not None:  # whole tensors, loaded before a sharded replica cuts them
        run.drafter.load_state_dict(state["drafter"])
    run.replica = Replica(run.drafter, run.device, config.data_parallel) if ranks.distributed else None
    run.parameters = [p for p in run.drafter.parameters() if p.requires_grad]  # a sharded replica's own shards
    run.held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in run.parameters)
    run.optimizer = torch.optim.AdamW(run.parameters, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if state is not None:
        load_optimizer_state(run.optimizer, state["optimizer"], run.parameters)
        run.step, run.tokens, run.losses, run.history = (
            state["step"],
            state["tokens"],
            state["losses"],
            state["history"],
        )
        run.resumed_from = run.step
        run.resumed_world_size = state.get("world_size", 1)


def _train_steps(
    run: _Run,
    dataset: ShardDataset,
    config: TrainConfig,
    ranks: Ranks,
    on_progress: Callable[[int, int, dict[str, float]], None] | None,
) -> float:
    """The steps from the run's to `config.steps`, each reported and checkpointed when due; the seconds they took."""
    progress_bar = _progress_bar(config.steps, run.step, config.method)
    started = time.perf_counter()
    tokens_at_start = run.tokens
    try:
        while run.step < config.steps:
            lr = _lr_at(config, run.step)
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            rows = ranks.slice(dataset.windows_for_step(run.step, config.batch_size, config.seed, run.train_windows))
            groups = micro_batches(run.train_windows[rows], config.batch_tokens)
            # each padded to its longest window, not to seq_len: padding is masked out of the loss and, at the end of
            # a causal window, changes no other position, so it would only cost compute
            micro = [dataset.batch(group) for group in groups]
            result = optimisation_step(
                run.drafter,
                micro,
                run.head,
                run.optimizer,
                run.parameters,
                config,
                run.step,
                run.autocast,
                ranks=ranks,
                replica=run.replica,
            )
            run.step += 1
            run.tokens += int(summed([float(sum(int(batch.valid.sum()) for batch in micro))], ranks)[0])
            del micro
            run.losses.append(float(result.total.detach()))
            seconds = time.perf_counter() - started
            metrics = _step_metrics(
                run, dataset, config, result, lr, (run.tokens - tokens_at_start) / max(seconds, 1e-9)
            )
            run.history.append({"step": run.step, **metrics})
            progress_bar.update(1)
            progress_bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
            if on_progress is not None:
                on_progress(run.step, config.steps, metrics)
            _checkpoint_if_due(run, config, ranks)
    finally:
        progress_bar.close()
    return time.perf_counter() - started


def _step_metrics(
    run: _Run, dataset: ShardDataset, config: TrainConfig, result: DraftLoss, lr: float, tokens_per_s: float
) -> dict[str, float]:
    """What a step reports: its loss, learning rate, speed and per-position accuracy, and held-out accuracy when
    an evaluation is due."""
    metrics = {"loss": run.losses[-1], "lr": lr, "tokens_per_s": tokens_per_s}
    for i, (h, c) in enumerate(zip(result.position_hits, result.position_counts, strict=True)):
        metrics[f"accuracy_pos{i}"] = h / c if c else 0.0
    if config.eval_every and run.step % config.eval_every == 0 and run.step < config.steps:
        with nullcontext() if run.replica is None else run.replica.gathered():
            accuracy, _ = evaluate(run.drafter, dataset, run.holdout_windows, run.head, config.batch_size, run.device)
        metrics.update({f"holdout_accuracy_pos{i}": a for i, a in enumerate(accuracy)})
    return metrics


def _checkpoint_if_due(run: _Run, config: TrainConfig, ranks: Ranks) -> None:
    """The leader writes the run's checkpoint every `checkpoint_every` steps; under FSDP every rank gathers it."""
    saving = run.checkpoint_path is not None and config.checkpoint_every and run.step % config.checkpoint_every == 0
    sharded = run.replica is not None and run.replica.sharded
    if not saving or not (ranks.leader or sharded) or run.checkpoint_path is None:
        return
    drafter_state, optimizer_state = whole_state(run.drafter, run.optimizer)  # every rank gathers a sharded one
    if ranks.leader:
        save_checkpoint(
            run.checkpoint_path,
            {
                "fingerprint": run.fingerprint,
                "dataset": run.dataset_id,
                "step": run.step,
                "tokens": run.tokens,
                "losses": run.losses,
                "history": run.history,
                "drafter": drafter_state,
                "optimizer": optimizer_state,
                "world_size": ranks.world_size,
            },
        )


def _finish(
    run: _Run,
    target_model: Any,
    dataset: ShardDataset,
    config: TrainConfig,
    ranks: Ranks,
    seconds: float,
    tokens_trained: int,
) -> tuple[Any, TrainReport]:
    """The trained drafter whole, evaluated on the held-out windows and handed back on the CPU with tensors of its
    own, with its report."""
    import torch

    drafter = run.drafter
    if run.replica is not None and run.replica.sharded:  # the trained drafter whole, as one process would hold it
        whole, _ = whole_state(drafter, run.optimizer)
        drafter = new_drafter_for(target_model, dataset, config)
        drafter.load_state_dict(whole)
        placed_for_training(drafter, target_model, run.device)
    accuracy, positions = evaluate(drafter, dataset, run.holdout_windows, run.head, config.batch_size, run.device)
    released_from_target(drafter, target_model, torch.device("cpu")).eval()
    report = TrainReport(
        method=drafter.method,
        steps=run.step,
        tokens=run.tokens,
        seconds=seconds,
        tokens_per_s=tokens_trained / max(seconds, 1e-9),
        final_loss=sum(run.losses[-10:]) / max(1, len(run.losses[-10:])),
        top1_agreement=accuracy[0] if accuracy else 0.0,
        position_accuracy=accuracy,
        holdout_positions=positions,
        draft_vocab_size=drafter.config.draft_vocab_size,
        resumed_from_step=run.resumed_from,
        resumed_world_size=run.resumed_world_size,
        world_size=ranks.world_size,
        trainable_held=run.held,
        warm_start_tensors=run.warm_tensors,
        losses=run.losses,
        history=run.history,
    )
    return drafter, report


def _progress_bar(total: int, initial: int, method: str):
    """A tqdm bar with loss and tokens/s; silent when stderr is not a terminal (CI, Prefect workers)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=f"training {method}", unit="step", disable=None, leave=False)
