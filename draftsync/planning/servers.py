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
    largest of the chained methods draftsync trains, at the profile's draft vocabulary)."""
    from draftsync.planning.training_plan import drafter_counts

    return 2 * sum(drafter_counts(target, profile))


def server_bytes(target: TargetShape, profile: SyncProfile, tensor_parallel_size: int) -> float:
    """What the validation server needs on each of its GPUs: its share of the target's and the drafter's weights and
    of one sequence's keys and values at the server's context, and its working memory."""
    context = server_context(target, profile) or target.context or PROMPT_ROOM_TOKENS
    shared = target.weight_bytes(on_gpu=True) + drafter_bytes(target, profile) + target.kv_bytes_per_token() * context
    return shared / tensor_parallel_size + SERVER_WORKING_GIB * GiB


def plan_server(target: TargetShape, worker: Worker, profile: SyncProfile) -> dict[str, Any] | None:
    """The fewest GPUs (a power of two dividing the target's attention heads), the freest first, whose free memory
    holds `server_bytes`; the share of each GPU the server may take (what the GPU leaves a sync, at most vLLM's
    default); the context it is sized for. None when no such set exists."""
    order = worker.freest()
    size = 1
    while size <= worker.gpus:
        chosen = sorted(order[:size])
        room = min(worker.free_gib(gpu) for gpu in chosen) * GiB
        if target.heads % size == 0 and server_bytes(target, profile, size) <= room:
            share = min(MAX_UTILIZATION, room / GiB / worker.gpu_memory_gib)
            return {
                "devices": chosen,
                "tensor_parallel_size": size,
                "gpu_memory_utilization": math.floor(share * 100 + 1e-9) / 100,  # never more than the room
                "max_model_len": server_context(target, profile),
            }
        size *= 2
    return None


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
    return Occupant(f"{stage}: the vLLM server", tuple(server["devices"]), holds)


def server_reason(server: dict[str, Any], target: TargetShape, weights: float) -> str:
    context = server.get("max_model_len")
    return (
        f"vLLM with tensor parallelism {server['tensor_parallel_size']} on GPUs "
        f"{','.join(map(str, server['devices']))}: the fewest GPUs (a power of two dividing its {target.heads} "
        f"attention heads) whose free memory holds a share of the {size_text(weights / GiB)} GiB of weights, the "
        f"drafter and a KV cache"
        + (f" of one {context:,}-token sequence (--max-model-len)" if context else "")
        + ", for the responses and the validation, each after the stage before it has let its GPUs go"
    )
