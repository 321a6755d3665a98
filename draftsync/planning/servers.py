"""The vLLM servers a sync starts (the target's responses, then the validation of the target with its drafter): on
which GPUs, with what tensor parallelism, what share of each GPU, and the context they are sized for.

vLLM takes `gpu_memory_utilization` of each GPU's whole memory at start (and refuses to start when less is free), and
at `--max-model-len` it must hold at least one sequence of keys and values beside the weights; without the flag it
sizes for the target's whole context (131,072 tokens for Llama-3.1, about 20 GiB a GPU for 70B at TP 2). So a plan
gives every server the context its stage needs and checks that weights, drafter and one such sequence fit its share.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from draftsync.planning.stages import Occupant, Refusal, gpu_refusal
from draftsync.planning.worker import GiB, Worker, size_text

if TYPE_CHECKING:
    from draftsync.planning.target_shape import TargetShape
    from draftsync.profiles import SyncProfile

SERVER_WORKING_GIB = 4.0  # a server's activations, sampler and graphs beyond weights and KV cache, at the least
PROMPT_ROOM_TOKENS = 2048  # the longest prompt a sync's servers are sized for (training and validation prompts)
MAX_UTILIZATION = 0.9  # vLLM's own default share of a GPU


def server_context(target: TargetShape, profile: SyncProfile) -> int | None:
    """`--max-model-len` for the sync's servers: a prompt's room and the longest output the responses or the
    validation ask for, within the target's context; None where neither is known (vLLM then takes the config's)."""
    check = profile.validation
    longest = max(profile.generated_max_tokens if profile.generated_samples else 0, check.max_tokens)
    if check.long_requests:
        if check.long_max_tokens is None:
            return target.context or None
        longest = max(longest, check.long_max_tokens)
    wanted = PROMPT_ROOM_TOKENS + longest
    return min(wanted, target.context) if target.context else wanted


def drafter_bytes(target: TargetShape, profile: SyncProfile) -> int:
    """The drafter the validation server loads beside the target, in 16 bits: the profile's DFlash drafter's weights
    with its copies of the target's embedding and lm_head, else an EAGLE-3 drafter's with its own embedding (the
    largest of the chained methods draftsync trains, at the profile's draft vocabulary); for a target with its own
    MTP head, that head."""
    from draftsync.planning.training_plan import drafter_counts

    if target.mtp_head is not None:  # the head served: its layer as stored, beside the target's embedding and head
        return target.mtp_head_bytes()
    return 2 * sum(drafter_counts(target, profile))


def server_bytes(
    target: TargetShape,
    profile: SyncProfile,
    tensor_parallel_size: int,
    *,
    context: int | None = None,
    drafter: bool = True,
    states_per_token: int = 0,
) -> float:
    """What a server needs on each of its GPUs: its share of the target's weights (and the drafter's, for the
    validation) and of one sequence's keys and values at its context, its working memory, and for a hidden-states
    server the states it caches a token (`states_per_token`, whole on every GPU: vLLM keeps them in a cache-only
    layer beside the KV cache). `context` None: the sync's servers' (`server_context`)."""
    context = context or server_context(target, profile) or target.context or PROMPT_ROOM_TOKENS
    shared = target.weight_bytes(on_gpu=True) + (drafter_bytes(target, profile) if drafter else 0)
    shared += target.kv_bytes_per_token() * context
    return shared / tensor_parallel_size + states_per_token * context + SERVER_WORKING_GIB * GiB


def plan_server(
    target: TargetShape,
    worker: Worker,
    profile: SyncProfile,
    *,
    context: int | None = None,
    drafter: bool = True,
    states_per_token: int = 0,
) -> dict[str, Any] | None:
    """The fewest GPUs a replica needs (a power of two dividing the target's attention heads) to hold `server_bytes`,
    and as many such replicas as the GPUs with room hold (vLLM's `--data-parallel-size`), the freest GPUs first; the
    share of each GPU a server may take (what the tightest of them leaves a sync, at most vLLM's default); the
    context it is sized for. None when no replica fits."""
    order = worker.freest()
    size = 1
    while size <= worker.gpus:
        needed = server_bytes(
            target, profile, size, context=context, drafter=drafter, states_per_token=states_per_token
        )
        groups = [order[start : start + size] for start in range(0, worker.gpus - size + 1, size)]
        fitting = []
        for group in groups:  # the freest first: once one lacks the room, the rest do too
            if min(worker.free_gib(gpu) for gpu in group) * GiB < needed:
                break
            fitting.append(group)
        if target.heads % size == 0 and fitting:
            room = min(worker.free_gib(gpu) for group in fitting for gpu in group) * GiB
            share = min(MAX_UTILIZATION, room / GiB / worker.gpu_memory_gib)
            return {
                "devices": sorted(gpu for group in fitting for gpu in group),
                "tensor_parallel_size": size,
                "data_parallel_size": len(fitting),
                "gpu_memory_utilization": math.floor(share * 100 + 1e-9) / 100,  # never more than the room
                "max_model_len": context or server_context(target, profile),
            }
        size *= 2
    return None


def replica_groups(server: dict[str, Any]) -> list[list[int]]:
    """The GPUs of each of a server's data-parallel replicas: its devices in runs of its tensor parallelism, as vLLM's
    data parallelism assigns them (rank i takes the i-th run of the GPUs it sees)."""
    devices, size = list(server["devices"]), int(server["tensor_parallel_size"])
    return [devices[start : start + size] for start in range(0, len(devices), size)]


def server_stage(
    stage: str, target: TargetShape, worker: Worker, profile: SyncProfile
) -> tuple[dict[str, Any], Refusal | None]:
    """The sync's vLLM server settings (the responses and the validation share them), or the refusal of `stage`."""
    server = plan_server(target, worker, profile)
    if server is None:
        needed = server_bytes(target, profile, 1)
        return {}, gpu_refusal(stage, needed, worker, worker.free_gib(0) * GiB, 0)
    return server, None


def server_occupant(stage: str, server: dict[str, Any], worker: Worker) -> Occupant | None:
    """What a stage's server holds: its share of every GPU it runs on (vLLM takes it whole at start)."""
    if not server:
        return None
    holds = round(server["gpu_memory_utilization"] * worker.gpu_memory_gib, 2)
    return Occupant(f"{stage}: the vLLM server", tuple(server["devices"]), holds, int(server["tensor_parallel_size"]))


def server_reason(server: dict[str, Any], target: TargetShape, weights: float) -> str:
    context = server.get("max_model_len")
    replicas = int(server.get("data_parallel_size", 1))
    groups = "; ".join(",".join(map(str, group)) for group in replica_groups(server))
    return (
        f"vLLM with tensor parallelism {server['tensor_parallel_size']}, the fewest GPUs (a power of two dividing its "
        f"{target.heads} attention heads) whose free memory holds a share of the {size_text(weights / GiB)} GiB of "
        f"weights, the drafter and a KV cache"
        + (f" of one {context:,}-token sequence (--max-model-len)" if context else "")
        + f"; {replicas} data-parallel replica(s) over every GPU that holds one (GPUs {groups}): the responses run as "
        f"one server with --data-parallel-size {replicas}, and so does the validation, its checklist's requests "
        f"{replicas} at a time, one a replica; "
        "each stage after the stage before it has let its GPUs go"
    )
