"""The sync's plan from the decision framework: what the target and the hardware serving it suggest.

The target's tags give its size and task mix; the deployments serving it give the GPUs, their memory
and the TPOT target. The recommendation is recorded on every drafter version; a profile with
`follow_recommendation` also trains the recommended method and sweeps the recommended gamma range.
Validation's measured knee then replaces the recommended start.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.cache_policies import NONE

from draftsync.planning.workload import BLOCK_MAX_BATCH, FRAMEWORK_TASK, NO_DRAFTER
from draftsync.profiles import BLOCK_BOUNDS, SyncProfile
from draftsync.registry.tags import TargetVersion, recommended_tags
from draftsync.settings import GPU_COUNTS
from draftsync.speculative.methods import MEDUSA_FAMILY, METHODS, TRAINED_METHODS
from draftsync.tasks import context
from draftsync.tasks.serving import configured_deployments

if TYPE_CHECKING:
    from draftsync.planning.recommendation import Recommendation
    from draftsync.planning.sync_plan import SyncPlan
    from draftsync.planning.worker import Worker
    from draftsync.tasks.dataset import TaskMix

ASSUMED_GPU_MEMORY_GB = 80.0
ASSUMED_TPOT_MS = 50.0  # 30-80 ms: the framework's middle band, when no deployment states a target


@dataclass(frozen=True)
class Advice:
    """The decision framework's advice for a sync, whether the sync followed it, and what was assumed to get it.
    `as_dict()` is a sync's `recommendation`: the recommendation's keys, then `applied` and `assumptions`."""

    recommendation: Recommendation
    applied: bool
    assumptions: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {**self.recommendation.to_dict(), "applied": self.applied, "assumptions": list(self.assumptions)}


@dataclass(frozen=True)
class DrafterPlan:
    """The advice, and the profile the sync then runs (the given one, unless the profile follows the advice)."""

    advice: Advice
    profile: SyncProfile


@task(name="plan-drafter", cache_policy=NONE)
def plan_drafter(target_name: str, target_tags: dict[str, str], profile: SyncProfile) -> DrafterPlan:
    """The recommendation for this target and the profile the sync then runs (unchanged unless it follows it)."""
    from draftsync.planning.recommendation import recommend
    from draftsync.planning.workload import Workload, target_memory_facts

    serving = [d for d in configured_deployments().values() if d.target_name == target_name]
    assumptions = []
    if serving:
        spec = serving[0]
        gpus, memory, tpot = spec.tensor_parallel_size, spec.gpu_memory_gb, spec.tpot_target_ms
        if tpot is None:
            tpot = ASSUMED_TPOT_MS
            assumptions.append(f"deployment {spec.name} states no tpot_target_ms: {ASSUMED_TPOT_MS:g} ms assumed")
    else:
        gpus, memory, tpot = 1, ASSUMED_GPU_MEMORY_GB, ASSUMED_TPOT_MS
        assumptions.append(
            f"no deployment serves {target_name}: 1 x {ASSUMED_GPU_MEMORY_GB:g} GB GPU and "
            f"TPOT {ASSUMED_TPOT_MS:g} ms assumed"
        )
    target = TargetVersion.from_tags(target_name, None, target_tags)
    mix = target.task_mix() or profile.default_task_mix
    main_task = max(mix, key=mix.__getitem__)
    workload = Workload(
        params_b=target.parameter_count() / 1e9,
        gpus=gpus,
        gpu_memory_gb=memory,
        tpot_ms=tpot,
        task=FRAMEWORK_TASK.get(main_task, "chat"),
        output_tokens=profile.validation.long_max_tokens or 1024,
        **target_memory_facts(target.num_hidden_layers, target.features(), target.parameter_count()),
    )
    advice = recommend(workload)
    if METHODS.get(advice.method) is not None and METHODS[advice.method].drafts_block:
        assumptions.append(
            f"batch {workload.batch} assumed, as a deployment states no batch: the block rule takes a block drafter "
            f"at batch <= {BLOCK_MAX_BATCH} only; traffic served in larger batches keeps {_sequential(workload)}"
        )
    chosen, applied = profile, False
    recommended = advice.method
    if target.mtp_head():
        assumptions.append(
            f"{target_name} ships its own {target.mtp_head()} MTP head: the sync measures that head, refreshes it when "
            f"stale and serves it with vLLM's method mtp; the recommended {recommended} is recorded only"
        )
    elif profile.follow_recommendation and recommended in TRAINED_METHODS:
        low, high = advice.gamma_range
        start = advice.gamma_start
        update: dict = {
            "method": recommended,
            "gamma": start,
            "validation": profile.validation.model_copy(update={"gamma_range": (low, high)}),
        }
        if METHODS[recommended].family == MEDUSA_FAMILY:
            update["medusa_heads"] = max(profile.medusa_heads, start)  # one head per drafted token
        elif METHODS[recommended].drafts_block:
            # one pass drafts at most what its field allows (a DFlash block also holds the committed token)
            knob, held = BLOCK_BOUNDS[METHODS[recommended].family]
            if getattr(profile, knob) < start + held:
                update[knob] = start + held
                after = " after the committed token" if held else ""
                assumptions.append(
                    f"{knob} raised from {getattr(profile, knob)} to {start + held}: the recommended gamma "
                    f"{start}{after}"
                )
        elif METHODS[recommended].chains and profile.ttt_steps < start:
            # a chained drafter learns as many positions ahead as it will draft
            update["ttt_steps"] = start
            assumptions.append(f"ttt_steps raised from {profile.ttt_steps} to the recommended gamma {start}")
        chosen = profile.model_copy(update=update)
        applied = True
    elif recommended == NO_DRAFTER:
        assumptions.append(
            f"the decision framework advises no speculative decoding for {target_name} on this hardware and "
            f"workload; the profile's {profile.method} drafter is trained and validated anyway, and a deployment "
            "serves it only where its own batch and latency ask for one"
        )
    elif profile.follow_recommendation:
        assumptions.append(
            f"recommended method {recommended!r} is not one a sync trains: the profile's {profile.method} is"
        )
    context.logger().info(
        "recommendation for %s: %s, gamma %s (start %s)%s",
        target_name,
        advice.method,
        list(advice.gamma_range),
        advice.gamma_start,
        "" if applied else " (recorded, not applied)",
    )
    return DrafterPlan(Advice(advice, applied, tuple(assumptions)), chosen)


def _sequential(workload: Any) -> str:
    """The method the framework gives this workload past the block rule's batch."""
    from dataclasses import replace

    from draftsync.planning.recommendation import recommend

    return recommend(replace(workload, batch=BLOCK_MAX_BATCH + 1)).method


def recommendation_tags(advice: Advice) -> dict[str, str]:
    """The tags a drafter version carries: what was recommended, whether the sync followed it, and why."""
    recommended = advice.recommendation
    reasons = "\n".join(recommended.reasons + advice.assumptions)
    return recommended_tags(
        recommended.method, recommended.gamma_range, recommended.gamma_start, advice.applied, reasons
    )


@task(name="plan-sync", cache_policy=NONE)
def plan_sync_resources(target_name: str, target_dir: str, task_mix: TaskMix, profile: SyncProfile) -> SyncPlan:
    """The sync's resource plan on this worker, shown in the Prefect UI with the task mix it is for; refused here,
    before any work, when a stage cannot fit (the error names the stage, the numbers and the fix)."""
    from dataclasses import replace
    from pathlib import Path

    from prefect.artifacts import create_markdown_artifact

    from draftsync.planning.sync_plan import plan_sync
    from draftsync.planning.target_shape import TargetShape
    from draftsync.planning.worker import detect_worker
    from draftsync.serving.vllm_engine import installed_vllm_version
    from draftsync.speculative.data.corpora import response_prompts

    if profile.trainer == "speculators":
        from draftsync.speculative.train.speculators import check_installed

        check_installed()

    settings = context.settings()
    worker = replace(detect_worker(settings.root, installed_vllm=installed_vllm_version), nodes=profile.train_nodes)
    if settings.disk_budget_gb is not None:
        worker = replace(worker, disk_gib=min(worker.disk_gib, settings.disk_budget_gb * 1e9 / 1024**3))
    worker = _beside_serving(worker)
    prompts = response_prompts(task_mix.shares, profile)
    plan = plan_sync(TargetShape.from_directory(Path(target_dir), target_name), worker, profile, len(prompts))
    create_markdown_artifact(
        markdown=f"{plan.markdown()}\nTask mix: {task_mix.text()}\n",
        description=f"resource plan of the sync of {target_name}",
    )
    context.logger().info(
        "plan for %s: target on %s, training on %s (%s-token micro-batches x %s, checkpointing %s)",
        target_name,
        plan.settings["target_placement"],
        plan.settings["training_device"],
        plan.settings["batch_tokens"],
        plan.settings["accumulation"],
        plan.settings["activation_checkpointing"],
    )
    plan.require_fit()
    plan.require_visible(os.environ)
    if plan.settings["hidden_states_engine"] == "vllm":
        from draftsync.serving.vllm_engine import find_vllm_engine
        from draftsync.serving.vllm_states import check_connector

        check_connector(find_vllm_engine())
    return plan


def _beside_serving(worker: Worker) -> Worker:
    """The worker with the GPU memory its configured vLLM deployments hold taken out."""
    from dataclasses import replace

    from draftsync.planning.worker import HeldMemory

    if not worker.gpus:
        return worker
    held = tuple(
        HeldMemory(spec.name, spec.tensor_parallel_size, fraction * worker.gpu_memory_gib)
        for spec in configured_deployments().values()
        if (fraction := spec.gpu_memory_fraction()) is not None
    )
    return replace(worker, held=held)


def requested_gpus(target_name: str, target_version: int, profile: SyncProfile) -> int:
    """The GPUs a sync of this version asks the draftsync-gpu pool for: what its plan needs on one of the pool's nodes
    (DRAFTSYNC_GPU_POOL_GPUS x DRAFTSYNC_GPU_POOL_GPU_MEMORY_GB, beside the configured deployments), rounded up to a
    count the sync triggers offer. A version whose tags cannot be planned from, or whose plan does not fit, asks for
    the whole node; the sync's own plan on the worker then decides, or refuses with the numbers."""
    from draftsync.planning.sync_plan import plan_sync
    from draftsync.planning.target_shape import TargetShape
    from draftsync.planning.worker import Worker

    settings = context.settings()
    node = settings.gpu_pool_gpus
    if node == 1:
        return 1  # nothing to size: no registry read on the request path
    tags = context.registry().version_tags(target_name, target_version)
    target = TargetVersion.from_tags(target_name, target_version, tags)
    features = target.features()
    hidden, layers, vocab = target.hidden_size, target.num_hidden_layers, target.vocab_size
    if features is None or "head_dim" not in features or hidden is None or layers is None or vocab is None:
        context.logger().warning(
            "%s v%d: no size tags to plan from (a sync sets them); the sync asks for all %d GPUs of a pool node",
            target_name,
            target_version,
            node,
        )
        return node
    shape = TargetShape.from_registered(
        target_name, parameters=target.parameter_count(), hidden=hidden, layers=layers, vocab=vocab, features=features
    )
    # host memory and disk are the worker's to check: only the GPUs are sized here
    worker = _beside_serving(Worker(node, settings.gpu_pool_gpu_memory_gb, 1e9, 1e9, nodes=profile.train_nodes))
    plan = plan_sync(shape, worker, profile)
    if not plan.fits:
        return node
    return next(count for count in GPU_COUNTS if count >= plan.gpus_needed)
