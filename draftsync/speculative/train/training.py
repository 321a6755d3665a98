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

import hashlib
import json
import math
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.files import atomic_write
from draftsync.speculative.machine import trains_in_bf16
from draftsync.speculative.methods import DEFAULT_METHOD, METHODS, is_eagle3_family
from draftsync.speculative.train.data_parallel import (
    DDP,
    ONE_PROCESS,
    REPLICAS,
    Ranks,
    Replica,
    load_optimizer_state,
    most,
    summed,
    whole_state,
)

if TYPE_CHECKING:
    import torch

    from draftsync.profiles import SyncProfile
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.data.training_batch import DraftLoss, TrainingBatch
    from draftsync.speculative.methods.drafter import Drafter

CHECKPOINT_FILE = "trainer-state.pt"


# TrainConfig fields added after the fingerprint was first written (see TrainConfig.fingerprint).
FIELDS_ADDED_LATER = ("min_lr_ratio", "position_decay", "ttt_feed", "teacher_temperature")
# How a step is laid out in memory, not what it computes: a checkpoint resumes across them.
MEMORY_ONLY_FIELDS = ("batch_tokens", "activation_checkpointing", "data_parallel")
# Target logits computed at once while filling a batch: [tokens x vocabulary] is never whole.
TARGET_CHUNK_ELEMENTS = 1 << 25


@dataclass
class TrainConfig:
    """How to train one drafter; the defaults suit the built-in CPU targets."""

    method: str = DEFAULT_METHOD
    draft_vocab_size: int | None = None  # None: the target's whole vocabulary
    aux_layer_ids: tuple[int, ...] | None = None  # EAGLE-3 only; None: default_aux_layer_ids(target layers)
    medusa_heads: int = 4
    draft_model_parameters: int | None = None  # draft_model only: parameter budget (None: an eagle3 drafter's)
    steps: int = 200
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 3e-3
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1  # the cosine decay ends at lr * min_lr_ratio (0: at zero, as SpecForge's does)
    ttt_steps: int = 1
    position_decay: float = 1.0  # chained drafters: draft position k's loss weighs position_decay**k
    # What later training-time-test steps of an EAGLE-3 drafter are fed: its own predicted state ("drafter", as at
    # inference, speculators and SpecForge) or the target's ("target": only for the ablation that measures it).
    ttt_feed: str = "drafter"
    # The target's distribution is learnt at this temperature: below 1 it is sharpened towards the target's greedy
    # token, which is all a drafter served at T=0 needs to agree with (the agreement counts are unchanged).
    teacher_temperature: float = 1.0
    noise_std: float = 0.0  # Gaussian noise on the target states, for robustness to the target's drift
    holdout_fraction: float = 0.05
    seed: int = 0
    freeze_embeddings: bool = True
    checkpoint_every: int = 0  # steps between resumable checkpoints (0: none)
    eval_every: int = 0  # steps between held-out evaluations reported to on_progress (0: only at the end)
    # Memory bounds of a step: the step's windows are split into micro-batches of at most `batch_tokens` tokens
    # (padded to their own longest window, not to seq_len) whose gradients accumulate; None: one micro-batch.
    batch_tokens: int | None = None
    activation_checkpointing: bool = False  # recompute the drafter layer's activations in backward (EAGLE-3)
    data_parallel: str = DDP  # how torchrun ranks hold the drafter: data_parallel.REPLICAS (the steps are the same)
    device: str = "auto"  # "cpu", "cuda", "cuda:N" or "auto" (CUDA when available)
    precision: str = "auto"  # "bf16" (autocast), "fp32" or "auto" (machine.trains_in_bf16: bf16 where it is faster)

    @classmethod
    def from_profile(cls, profile: SyncProfile, warm_start: bool) -> TrainConfig:
        """The config a sync with `profile` trains with (`warm_start`: continuing the previous version's drafter)."""
        return cls(
            method=profile.method,
            draft_vocab_size=None if METHODS[profile.method].full_vocabulary else profile.draft_vocab_size,
            aux_layer_ids=profile.aux_layer_ids,
            medusa_heads=profile.medusa_heads,
            steps=profile.warm_start_steps if warm_start else profile.train_steps,
            batch_size=profile.batch_size,
            seq_len=profile.seq_len,
            batch_tokens=profile.batch_tokens,
            activation_checkpointing=profile.activation_checkpointing,
            lr=profile.lr,
            warmup_steps=profile.warmup_steps,
            min_lr_ratio=profile.min_lr_ratio,
            ttt_steps=profile.ttt_steps,
            position_decay=profile.position_decay,
            teacher_temperature=profile.teacher_temperature,
            noise_std=profile.noise_std,
            seed=profile.seed,
            checkpoint_every=profile.checkpoint_every,
            device=profile.training_device,
            data_parallel=DDP if profile.data_parallel == "auto" else profile.data_parallel,
        )

    def fingerprint(self, warm_start: bool = False) -> str:
        """What a checkpoint must agree with to be resumed: everything that shapes the run, `steps` included
        (the learning-rate schedule spans them) and whether it started from a previous drafter."""
        # Fields added after checkpoints were first written count only away from their defaults, so a run started
        # before they existed still resumes.
        later = {f.name: f.default for f in fields(self) if f.name in FIELDS_ADDED_LATER}
        data = {
            k: v
            for k, v in asdict(self).items()
            if k not in ("checkpoint_every", "eval_every", *MEMORY_ONLY_FIELDS) and not (k in later and v == later[k])
        }
        data["warm_start"] = warm_start
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=list).encode()).hexdigest()[:16]


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


def new_drafter_for(target_model: Any, dataset: ShardDataset, config: TrainConfig):
    """A fresh drafter of `config.method` shaped for the target, with its draft vocabulary from the data.

    `draft_model` (the benchmark's independent small LM) gets the parameter budget of an EAGLE-3 drafter's
    own weights unless one is given.
    """
    import torch

    from draftsync.speculative.data.draft_vocab import build_draft_vocab
    from draftsync.speculative.methods.registry import new_drafter_to_train

    target_config = target_model.config
    vocab_size = target_config.vocab_size
    draft_vocab_size = config.draft_vocab_size or vocab_size
    aux = None
    if is_eagle3_family(config.method):  # the methods that read aux states: the training's ids, else the dataset's
        aux = config.aux_layer_ids if config.aux_layer_ids is not None else dataset.aux_layer_ids
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        drafter = new_drafter_to_train(
            config.method,
            target_config,
            None if draft_vocab_size == vocab_size else draft_vocab_size,
            aux,
            medusa_heads=config.medusa_heads,
            draft_model_parameters=config.draft_model_parameters,
        )
    if drafter.config.draft_vocab_size < vocab_size:
        d2t, t2d = build_draft_vocab(dataset.token_counts(), drafter.config.draft_vocab_size)
        drafter.set_draft_vocab(d2t, t2d)
    drafter.initialise_from_target(target_model, freeze_embeddings=config.freeze_embeddings)
    return drafter


def warm_start(drafter: Any, source: Any) -> int:
    """Copy every same-named, same-shaped tensor of `source` into `drafter`; returns how many were copied.

    Output heads are copied row by row, following each row's target token id, so a draft vocabulary that
    moved between target versions keeps what the old drafter knew about the ids both share.
    """
    import torch

    if source.method != drafter.method:
        return 0
    own = drafter.state_dict()
    copied = 0
    head_names = {name for name in own if name.endswith("lm_head.weight")}
    # frozen copies of the target (its embedding) come from this target, never from the previous one's drafter
    from_target = set(drafter.target_copy_names) & {n for n, p in drafter.named_parameters() if not p.requires_grad}
    with torch.no_grad():
        for name, tensor in source.state_dict().items():
            if (
                name in ("d2t", "t2d")
                or name in from_target
                or name not in own
                or own[name].shape[1:] != tensor.shape[1:]
            ):
                continue
            if name in head_names:
                rows_of = {int(t): i for i, t in enumerate(source.draft_token_ids.tolist())}
                for row, target_id in enumerate(drafter.draft_token_ids.tolist()):
                    if target_id in rows_of:
                        own[name][row].copy_(tensor[rows_of[target_id]])
                copied += 1
            elif own[name].shape == tensor.shape:
                own[name].copy_(tensor)
                copied += 1
    return copied


def _target_head(target_model: Any):
    """The target's lm_head: it turns the stored post-norm state into the target's distribution."""
    return target_model.get_output_embeddings()


def _to_device(batch: TrainingBatch, device: torch.device) -> TrainingBatch:
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


def _with_target_logits(
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


def _draft_columns(drafter: Any, vocab_size: int, device: torch.device) -> torch.Tensor | None:
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


def _lr_at(config: TrainConfig, step: int) -> float:
    warm = min(1.0, (step + 1) / max(1, config.warmup_steps))
    progress = step / max(1, config.steps)
    floor = config.min_lr_ratio
    return config.lr * warm * (floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress)))


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Atomically: a crash while writing leaves the previous checkpoint intact."""
    import torch

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda tmp: torch.save(state, tmp))


def _load_checkpoint(path: Path, fingerprint: str, dataset_id: str) -> dict[str, Any] | None:
    import torch

    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:  # a torn or foreign file: say which and how to recover
        raise DraftsyncError(
            f"training checkpoint {path} cannot be read ({error})", f"delete {path} to train from scratch"
        ) from error
    if state.get("fingerprint") != fingerprint or state.get("dataset") != dataset_id:
        raise DraftsyncError(
            f"training checkpoint {path} belongs to another run (different config or dataset)",
            f"use another checkpoint directory, or delete {path} to train from scratch",
        )
    return state


def evaluate(
    drafter: Any, dataset: ShardDataset, windows: torch.Tensor, head: Any, batch_size: int, device: torch.device
) -> tuple[list[float], int]:
    """Held-out top-1 accuracy per draft position (loss-masked positions) and the positions counted."""
    import torch

    hits: list[int] = []
    counts: list[int] = []
    was_training = drafter.training
    drafter.eval()
    columns = _draft_columns(drafter, head.weight.shape[0], device)
    with torch.no_grad():
        for batch in dataset.batches(windows, batch_size):
            batch = _with_target_logits(_to_device(batch, device), head, columns=columns)
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
    if is_eagle3_family(config.method):
        wanted = tuple(config.aux_layer_ids) if config.aux_layer_ids is not None else dataset.aux_layer_ids
        if not dataset.has_aux or tuple(dataset.aux_layer_ids) != wanted:
            raise DraftsyncError(
                f"dataset {dataset.path} holds aux states of layers {list(dataset.aux_layer_ids)} "
                f"(stored: {dataset.has_aux}); {config.method} was asked to read {list(wanted)}",
                "rebuild the dataset with these aux layer ids, or train with the dataset's",
            )


def _dataset_identity(dataset: ShardDataset) -> str:
    manifest = dataset.manifest
    return f"{manifest['target']['fingerprint']}:{manifest['samples_digest']}:{manifest['num_sequences']}"


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
    columns = _draft_columns(drafter, head.weight.shape[0], device)
    feed = {"feed_target_states": True} if config.ttt_feed == "target" else {}
    masked = [int(batch.loss_mask[:, 2:].sum()) for batch in micro]
    everything = sum(summed([float(sum(masked))], ranks))
    batches = sum(summed([float(len(micro))], ranks))
    combined = DraftLoss(total=torch.zeros(()), position_losses=[], position_hits=[], position_counts=[])
    rounds = most(len(micro), ranks) if replica is not None and replica.sharded else len(micro)
    for index in range(rounds):
        padding = index >= len(micro)  # only a sharded replica's: every rank gathers the weights as often
        share = 0.0 if padding else masked[index] / everything if everything else 1.0 / batches
        batch = _with_target_logits(
            _to_device(micro[min(index, len(micro) - 1)], device), head, config.teacher_temperature, columns
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
    Long: the checks, the set-up, the resume and the step loop share the drafter, the optimiser and the ranks, and
    read in the order a run takes them.
    """
    import torch

    if config.steps < 0:
        raise DraftsyncError(f"training steps {config.steps} is negative", "use steps >= 0")
    if config.ttt_steps < 1:
        raise DraftsyncError(f"ttt_steps={config.ttt_steps} is below 1", "use ttt_steps >= 1")
    if config.ttt_feed not in ("drafter", "target"):
        raise DraftsyncError(f"ttt_feed {config.ttt_feed!r} is not known", "use drafter or target")
    if config.ttt_feed == "target" and not is_eagle3_family(config.method):
        raise DraftsyncError(
            f"ttt_feed=target is measured for EAGLE-3 drafters only, not {config.method}", "use ttt_feed=drafter"
        )
    if not 0.0 <= config.min_lr_ratio <= 1.0 or not 0.0 < config.position_decay <= 1.0:
        raise DraftsyncError(
            f"min_lr_ratio {config.min_lr_ratio} or position_decay {config.position_decay} is out of range",
            "use 0 <= min_lr_ratio <= 1 and 0 < position_decay <= 1",
        )
    if config.teacher_temperature <= 0.0:
        raise DraftsyncError(
            f"teacher_temperature {config.teacher_temperature} is not positive", "use a teacher_temperature > 0"
        )
    if config.data_parallel not in REPLICAS:
        raise DraftsyncError(
            f"data_parallel {config.data_parallel!r} is not known", f"use one of {list(REPLICAS)} in the sync profile"
        )
    if config.batch_size < ranks.world_size:
        raise DraftsyncError(
            f"a batch of {config.batch_size} windows cannot be shared by {ranks.world_size} training processes",
            f"use batch_size >= {ranks.world_size} in the sync profile, or fewer processes",
        )
    _check_dataset(dataset, target_model, config)
    device = _device(config.device)
    bf16 = trains_in_bf16(config.precision, device)
    target_model.eval()
    head = _target_head(target_model).to(device)
    train_ids, holdout_ids = dataset.split(config.holdout_fraction, config.seed)
    train_windows = dataset.windows(train_ids, config.seq_len)
    holdout_windows = dataset.windows(holdout_ids or train_ids, config.seq_len)
    if train_windows.shape[0] == 0:
        raise DraftsyncError(
            f"dataset {dataset.path} has no training window of 3 or more tokens",
            "build the dataset from longer texts or more samples",
        )

    drafter = new_drafter_for(target_model, dataset, config)
    warm_tensors = warm_start(drafter, init_from) if init_from is not None else 0
    drafter.to(device).train()
    drafter.activation_checkpointing = config.activation_checkpointing

    checkpoint_path = Path(checkpoint_dir) / CHECKPOINT_FILE if checkpoint_dir is not None else None
    fingerprint = config.fingerprint(warm_start=init_from is not None)
    step = tokens = 0
    losses: list[float] = []
    history: list[dict[str, float]] = []
    resumed_from = 0
    resumed_world_size = None
    dataset_id = _dataset_identity(dataset)
    state = _load_checkpoint(checkpoint_path, fingerprint, dataset_id) if checkpoint_path else None
    if state is not None:  # whole tensors, loaded before a sharded replica cuts them
        drafter.load_state_dict(state["drafter"])
    replica = Replica(drafter, device, config.data_parallel) if ranks.distributed else None
    parameters = [p for p in drafter.parameters() if p.requires_grad]  # a sharded replica's own shards
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in parameters)
    optimizer = torch.optim.AdamW(parameters, lr=config.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if state is not None:
        load_optimizer_state(optimizer, state["optimizer"], parameters)
        step, tokens, losses, history = state["step"], state["tokens"], state["losses"], state["history"]
        resumed_from = step
        resumed_world_size = state.get("world_size", 1)

    autocast = torch.autocast(device.type, dtype=torch.bfloat16) if bf16 else nullcontext()
    progress_bar = _progress_bar(config.steps, step, config.method)
    started = time.perf_counter()
    tokens_at_start = tokens
    try:
        while step < config.steps:
            lr = _lr_at(config, step)
            for group in optimizer.param_groups:
                group["lr"] = lr
            rows = ranks.slice(dataset.windows_for_step(step, config.batch_size, config.seed, train_windows))
            groups = micro_batches(train_windows[rows], config.batch_tokens)
            width = None if config.batch_tokens is not None else config.seq_len
            micro = [dataset.batch(group, width) for group in groups]
            result = optimisation_step(
                drafter, micro, head, optimizer, parameters, config, step, autocast, ranks=ranks, replica=replica
            )

            step += 1
            tokens += int(summed([float(sum(int(batch.valid.sum()) for batch in micro))], ranks)[0])
            del micro
            losses.append(float(result.total.detach()))
            seconds = time.perf_counter() - started
            metrics = {"loss": losses[-1], "lr": lr, "tokens_per_s": (tokens - tokens_at_start) / max(seconds, 1e-9)}
            for i, (h, c) in enumerate(zip(result.position_hits, result.position_counts, strict=True)):
                metrics[f"accuracy_pos{i}"] = h / c if c else 0.0
            if config.eval_every and step % config.eval_every == 0 and step < config.steps:
                with nullcontext() if replica is None else replica.gathered():
                    accuracy, _ = evaluate(drafter, dataset, holdout_windows, head, config.batch_size, device)
                metrics.update({f"holdout_accuracy_pos{i}": a for i, a in enumerate(accuracy)})
            history.append({"step": step, **metrics})
            progress_bar.update(1)
            progress_bar.set_postfix(loss=f"{metrics['loss']:.3f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
            if on_progress is not None:
                on_progress(step, config.steps, metrics)
            saving = checkpoint_path is not None and config.checkpoint_every and step % config.checkpoint_every == 0
            sharded = replica is not None and replica.sharded
            if saving and (ranks.leader or sharded) and checkpoint_path is not None:
                drafter_state, optimizer_state = whole_state(drafter, optimizer)  # every rank gathers a sharded one
                if ranks.leader:
                    _save_checkpoint(
                        checkpoint_path,
                        {
                            "fingerprint": fingerprint,
                            "dataset": dataset_id,
                            "step": step,
                            "tokens": tokens,
                            "losses": losses,
                            "history": history,
                            "drafter": drafter_state,
                            "optimizer": optimizer_state,
                            "world_size": ranks.world_size,
                        },
                    )
    finally:
        progress_bar.close()

    seconds = time.perf_counter() - started
    if replica is not None and replica.sharded:  # the trained drafter whole, as one process would hold it
        whole, _ = whole_state(drafter, optimizer)
        drafter = new_drafter_for(target_model, dataset, config)
        drafter.load_state_dict(whole)
        drafter.to(device)
    accuracy, positions = evaluate(drafter, dataset, holdout_windows, head, config.batch_size, device)
    drafter.to("cpu").eval()
    report = TrainReport(
        method=drafter.method,
        steps=step,
        tokens=tokens,
        seconds=seconds,
        tokens_per_s=(tokens - tokens_at_start) / max(seconds, 1e-9),
        final_loss=sum(losses[-10:]) / max(1, len(losses[-10:])),
        top1_agreement=accuracy[0] if accuracy else 0.0,
        position_accuracy=accuracy,
        holdout_positions=positions,
        draft_vocab_size=drafter.config.draft_vocab_size,
        resumed_from_step=resumed_from,
        resumed_world_size=resumed_world_size,
        world_size=ranks.world_size,
        trainable_held=held,
        warm_start_tensors=warm_tensors,
        losses=losses,
        history=history,
    )
    return drafter, report


def _progress_bar(total: int, initial: int, method: str):
    """A tqdm bar with loss and tokens/s; silent when stderr is not a terminal (CI, Prefect workers)."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=f"training {method}", unit="step", disable=None, leave=False)
