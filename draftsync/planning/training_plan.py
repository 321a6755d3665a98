"""The training stage of a plan: how many torchrun ranks, on which GPUs, with which micro-batch, checkpointing and
data parallelism, so that every rank's step fits the GPU it runs on.

Ranks go only to GPUs with room for a step: the freest first, and as many as the step's windows and those GPUs allow.
A GPU a serving deployment holds, or one the target keeps for online states, counts what it leaves, not its size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from draftsync.errors import DraftsyncError
from draftsync.planning.stages import Occupant, Refusal, StagePlan
from draftsync.planning.worker import HOST_RESERVE_GIB, GiB, Worker, gib
from draftsync.speculative.methods import (
    DFLASH_ANCHORS,
    DFLASH_FAMILY,
    DFLASH_LAYERS,
    METHODS,
    MTP_FAMILY,
    PEAGLE_FAMILY,
    is_eagle3_family,
)

if TYPE_CHECKING:
    from draftsync.planning.target_shape import TargetShape
    from draftsync.profiles import SyncProfile

# The step-memory model's predictions came out at 0.82-0.85 of the measured peak for bf16 steps (docs/TRAINING.md,
# bench/train_memory.py): a plan sizes a step at the prediction over the worst of those ratios.
STEP_MEMORY_MARGIN = 1 / 0.82
HOST_WORKING_GIB = 2.0  # a GPU stage's host memory beyond its buffers: the process, torch, the tokenizer
# Throughputs behind the time estimates (assumed, not measured): an H100-class GPU at 40% of its 989 bf16 TFLOP/s;
# a CPU worker at 0.2 TFLOP/s.
GPU_FLOPS = 0.4 * 989e12
CPU_FLOPS = 0.2e12


@dataclass(frozen=True)
class _Step:
    """One candidate layout of a step: micro-batch tokens, checkpointing, its bytes and how ranks hold AdamW."""

    tokens: int
    checkpointing: bool
    memory: float
    replica: str


def plan_training(
    target: TargetShape, worker: Worker, profile: SyncProfile, kept: Occupant | None = None, *, online: bool = False
) -> tuple[StagePlan, dict[str, Any], Refusal | None]:
    """The training stage: ranks on the freest GPUs that hold a step, the largest micro-batch that fits them (halving
    from the whole batch to one window, then activation checkpointing), DDP before FSDP2; refused when one window
    does not fit the freest GPU.

    `kept`: the target the hidden-states stage leaves on its GPUs for online states, a device_map's share on each; it
    trains in one process beside it when it spans several GPUs. Online on one GPU, each of several ranks loads a whole
    target of its own instead (the stage's copy is released first). Offline, a rank reads only the target's head. On
    a CPU the profile's ranks share its cores and host memory, each with its own fp32 target when online."""
    on_gpu = worker.gpus > 0
    whole_target = float(target.weight_bytes(on_gpu=True))

    def room(gpu: int, ranks: int) -> float:
        """What a rank on `gpu` has for its step: the GPU's free bytes less the target held there."""
        free = worker.free_gib(gpu) * GiB
        if not online or kept is None:
            return free
        if ranks > 1:
            return free - whole_target  # each rank its own copy; the stage's copy is released before they start
        return free - (kept.gib * GiB if gpu in kept.gpus else 0.0)

    if on_gpu:
        most = 1 if kept is not None and len(kept.gpus) > 1 else min(worker.gpus, profile.batch_size // worker.nodes)
        for per_node in range(max(1, most), 0, -1):
            gpus = sorted(sorted(range(worker.gpus), key=lambda g: room(g, per_node), reverse=True)[:per_node])
            budget = min(room(g, per_node) for g in gpus)
            step = _largest_step(target, profile, budget, per_node * worker.nodes, on_gpu)
            if step.memory <= budget:
                break
    else:
        per_node, gpus = profile.train_processes, []
        copies = per_node if online else 1  # offline, a rank reads only the target's head
        budget = (worker.host_memory_gib - HOST_RESERVE_GIB) * GiB - target.weight_bytes(False) * copies
        step = _largest_step(target, profile, budget, per_node * worker.nodes, on_gpu)
    own_copy = whole_target if online and on_gpu and per_node > 1 else 0.0
    processes = per_node * worker.nodes
    whole = profile.batch_size * profile.seq_len
    accumulation = math.ceil(whole / step.tokens)
    settings = {
        "train_processes": processes,
        "data_parallel": step.replica,
        "training_device": f"cuda:{gpus[0]}" if on_gpu else "cpu",
        "training_devices": gpus,
        "batch_tokens": step.tokens,
        "accumulation": accumulation,
        "activation_checkpointing": step.checkpointing,
    }
    occupants: list[Occupant] = [kept] if kept is not None and not own_copy else []
    if on_gpu:
        holder = "training: a torchrun rank" if per_node > 1 else "training: the trainer"
        occupants.append(
            Occupant(holder + (" with its own target" if own_copy else ""), tuple(gpus), gib(step.memory + own_copy))
        )
    hours, assumptions = _hours(target, profile, processes, on_gpu)
    stage = StagePlan(
        "training",
        gib(step.memory + own_copy) if on_gpu else 0.0,
        gib(step.memory) if not on_gpu else HOST_WORKING_GIB,
        0.0,
        hours,
        {
            "micro_batch_tokens": step.tokens,
            "accumulation": accumulation,
            "activation_checkpointing": step.checkpointing,
            "train_processes": processes,
            **({"devices": gpus} if on_gpu else {}),
        },
        tuple(occupants),
        assumptions,
    )
    refusal = None
    if step.memory > budget:
        where = f"GPU cuda:{gpus[0]}" if on_gpu else "host memory"
        refusal = Refusal(
            "training",
            f"{gib(step.memory):.1f} GiB on {where} for one {profile.seq_len}-token window"
            f"{' with activation checkpointing' if step.checkpointing else ''} (the drafter, AdamW, the target's "
            "head)",
            f"{gib(budget):.1f} GiB free there",
            "use a GPU with more memory, a shorter seq_len or a smaller "
            f"{'block_size' if _dflash(profile) else 'draft_vocab_size'} in the sync profile",
        )
    return stage, settings, refusal


def check_drafter_settings(target: TargetShape, profile: SyncProfile) -> None:
    """Refuse, before any work, what the profile asks of a drafter that this target cannot give it: aux layer ids
    it does not have, a DFlash drafter whose layers vLLM would split across KV cache groups beside its windowed
    layers, a block drafter's mask token outside its vocabulary (its block is the profile's own check)."""
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids
    from draftsync.speculative.families import draft_layers_split

    method = METHODS[profile.method]
    dflash = method.family == DFLASH_FAMILY
    ids = profile.aux_layer_ids
    if method.reads_aux_states and ids is not None:
        lowest = 1 if dflash else 0  # DFlash reads decoder layer outputs, not the embedding
        if len(set(ids)) != len(ids) or not all(lowest <= k <= target.layers for k in ids):
            raise DraftsyncError(
                f"sync profile {profile.name}: aux_layer_ids {list(ids)} are not distinct layers of {target.name}, "
                f"whose {profile.method} drafter can read layers {lowest}..{target.layers}",
                f"set aux_layer_ids to distinct ids in {lowest}..{target.layers}, or leave it unset for the default "
                f"depths ({list(default_aux_layer_ids(target.layers))} here)",
            )
    split = draft_layers_split(target.config, DFLASH_LAYERS) if dflash else None
    if split:  # a plan from registry tags has no config to say; the worker's own plan reads the checkpoint's
        raise DraftsyncError(
            f"sync profile {profile.name}: method {profile.method} for {target.name}: {split}",
            "sync this target with method eagle3 (or another method that drafts from one layer)",
        )
    mask = profile.mask_token_id
    if method.drafts_block and mask is not None and mask >= target.vocab:  # DFlash's and P-EAGLE's masked rows
        raise DraftsyncError(
            f"sync profile {profile.name}: mask_token_id {mask} is outside the vocabulary of {target.name} "
            f"(0..{target.vocab - 1})",
            "set mask_token_id to a token id the target has and its text rarely uses (its pad token), or leave it "
            "unset for the pad token, else the last id",
        )


def _largest_step(target: TargetShape, profile: SyncProfile, budget: float, processes: int, on_gpu: bool) -> _Step:
    """The first step layout that fits `budget`, in the order of preference; else the smallest, for the refusal."""
    from draftsync.speculative.train.step_memory import BF16, FP32, predict_step_memory

    width = BF16 if on_gpu else FP32
    candidates = []
    tokens = profile.batch_size * profile.seq_len
    while tokens >= profile.seq_len:
        candidates.append((tokens, False))
        tokens //= 2
    if not _dflash(profile):  # a DFlash step has no layer to recompute
        candidates.append((profile.seq_len, True))
    # DDP at the largest micro-batch that fits; FSDP2 (AdamW's state shared out) only where no DDP step fits.
    if profile.data_parallel != "auto" or processes == 1:
        replicas = [profile.data_parallel if profile.data_parallel != "auto" else "ddp"]
    else:
        replicas = ["ddp", "fsdp"]
    chosen = None
    for replica in replicas:
        for tokens, checkpointing in candidates:
            shape = step_shape(target, profile, tokens, checkpointing, width)
            if replica == "fsdp":
                shape = replace(shape, optimizer_shards=processes)
            memory = predict_step_memory(shape)["total"] * STEP_MEMORY_MARGIN
            chosen = _Step(tokens, checkpointing, memory, replica)
            if memory <= budget:
                return chosen
    assert chosen is not None
    return chosen


def step_shape(target: TargetShape, profile: SyncProfile, tokens: int, checkpointing: bool, width: int):
    """The shape of a training step of the profile's drafter for `target`: `tokens` a micro-batch, `width` bytes an
    activation and a head weight."""
    from draftsync.speculative.train.step_memory import StepShape

    method = METHODS[profile.method]
    block: dict[str, int] = {}
    if _dflash(profile):
        anchors = min(DFLASH_ANCHORS, profile.seq_len)
        block = {"draft_layers": DFLASH_LAYERS, "block_rows": anchors * profile.block_size}
    if method.family == MTP_FAMILY:  # the target's own head layer, reading one state of the target
        block = {"head_parameters": target.mtp_head_parameters(), "aux_layers": 1}
    return StepShape(
        hidden=target.hidden,
        vocab=target.vocab,
        draft_vocab=target.vocab if method.full_vocabulary else min(profile.draft_vocab_size, target.vocab),
        heads=target.heads,
        kv_heads=target.kv_heads,
        head_dim=target.head_dim,
        intermediate=target.intermediate,
        batch=tokens // profile.seq_len,
        seq_len=profile.seq_len,
        ttt_steps=_depths(profile),
        head_bytes=width,
        activation_bytes=width,
        checkpointing=checkpointing,
        **block,
    )


def drafter_counts(target: TargetShape, profile: SyncProfile) -> tuple[int, int]:
    """(trainable, frozen) parameters of the profile's drafter for `target` (`step_memory.drafter_parameters`)."""
    from draftsync.speculative.train.step_memory import drafter_parameters

    return drafter_parameters(step_shape(target, profile, profile.seq_len, False, 2))


def _hours(target: TargetShape, profile: SyncProfile, processes: int, on_gpu: bool) -> tuple[float, str]:
    """Estimated from the step's FLOPs at the assumed throughput: hours or weeks, no finer; and its figures."""
    trainable, _ = drafter_counts(target, profile)
    ttt = _depths(profile)
    whole = profile.batch_size * profile.seq_len
    if _dflash(profile):
        flops = profile.train_steps * _block_step_flops(step_shape(target, profile, whole, False, 2), trainable)
    else:
        flops = profile.train_steps * whole * (6 * trainable + 2 * target.hidden * target.vocab) * ttt
    throughput = GPU_FLOPS * processes if on_gpu else CPU_FLOPS
    where = f"{processes} GPU(s) at {GPU_FLOPS / 1e12:.0f} TFLOP/s each" if on_gpu else f"{CPU_FLOPS / 1e12:g} TFLOP/s"
    return flops / throughput / 3600, (
        f"{profile.train_steps:,} steps of {whole:,} tokens: {flops:.3g} FLOPs (the drafter's "
        f"{trainable / 1e9:.2g}B trainable parameters forward and backward and the target's head, "
        f"{_depths(profile)} depth(s)) on {where}"
    )


def _block_step_flops(shape: Any, trainable: int) -> float:
    """A DFlash step: the target's logits at every token; the fused context and each layer's keys and values of it;
    the block rows through the layers (forward and backward), their attention over the window and the frozen lm_head
    (forward, and backward to its input)."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    rows = shape.batch * shape.block_rows
    context = 6 * shape.tokens * (shape.aux_layers * h * h + shape.draft_layers * 2 * h * kv)
    layers = 6 * rows * (trainable - shape.aux_layers * h * h)
    attention = 6 * shape.draft_layers * rows * (shape.seq_len + shape.block_rows) * 2 * shape.heads * shape.head_dim
    return 2 * shape.tokens * h * shape.vocab + context + layers + attention + 4 * rows * h * shape.vocab


def _depths(profile: SyncProfile) -> int:
    """The positions ahead an EAGLE-style layer is run for at each training step, each with its activations and
    logits kept for backward: EAGLE-3's and an MTP head's training-time-test steps, or every one of P-EAGLE's
    max_draft_tokens depths (its objective trains them all, whatever ttt_steps says); 1 for the others."""
    if is_eagle3_family(profile.method) or METHODS[profile.method].family == MTP_FAMILY:
        return profile.ttt_steps
    if METHODS[profile.method].family == PEAGLE_FAMILY:
        return profile.max_draft_tokens
    return 1


def _dflash(profile: SyncProfile) -> bool:
    return METHODS[profile.method].family == DFLASH_FAMILY
