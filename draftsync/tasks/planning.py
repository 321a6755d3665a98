"""The sync's plan from the decision framework: what the target and the hardware serving it suggest.

The target's tags give its size and task mix; the deployments serving it give the GPUs, their memory
and the TPOT target. The recommendation is recorded on every drafter version; a profile with
`follow_recommendation` also trains the recommended method and sweeps the recommended gamma range.
Validation's measured knee then replaces the recommended start.
"""

from __future__ import annotations

import json

from prefect import task
from prefect.cache_policies import NONE

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import is_eagle3_family
from draftsync.tasks import context
from draftsync.tasks.profile import SyncProfile
from draftsync.tasks.serving import configured_deployments

# The built-in corpora's task names, in the framework's words: prose is conversational text, the
# framework's conservative case.
FRAMEWORK_TASK = {"code": "code", "math": "math", "prose": "chat"}
ASSUMED_GPU_MEMORY_GB = 80.0
ASSUMED_TPOT_MS = 50.0  # 30-80 ms: the framework's middle band, when no deployment states a target
RECOMMENDED_PREFIX = "draftsync.recommended."


@task(name="plan-drafter", cache_policy=NONE)
def plan_drafter(target_name: str, target_tags: dict[str, str], profile: SyncProfile) -> dict:
    """The recommendation for this target and the profile the sync then runs (unchanged unless it follows it)."""
    from draftsync.serving.recommendation import Workload, recommend

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
        assumptions.append(f"no deployment serves {target_name}: 1 x {ASSUMED_GPU_MEMORY_GB:g} GB GPU and "
                           f"TPOT {ASSUMED_TPOT_MS:g} ms assumed")
    mix = _declared_mix(target_name, target_tags) or {"prose": 1.0}
    main_task = max(mix, key=mix.get)
    workload = Workload(params_b=_parameter_count(target_name, target_tags) / 1e9, gpus=gpus, gpu_memory_gb=memory,
                        tpot_ms=tpot, task=FRAMEWORK_TASK.get(main_task, "chat"),
                        output_tokens=profile.validation.long_max_tokens or 1024)
    advice = recommend(workload).to_dict()
    chosen, applied = profile, False
    if profile.follow_recommendation and is_eagle3_family(advice["method"]):
        low, high = advice["gamma_range"]
        chosen = profile.model_copy(update={
            "method": advice["method"], "gamma": advice["gamma_start"],
            "validation": profile.validation.model_copy(update={"gamma_range": (low, high)})})
        applied = True
    elif profile.follow_recommendation:
        assumptions.append(f"recommended method {advice['method']!r} is not trained by a sync: "
                           f"the profile's {profile.method} is")
    context.logger().info("recommendation for %s: %s, gamma %s (start %s)%s", target_name, advice["method"],
                          advice["gamma_range"], advice["gamma_start"], "" if applied else " (recorded, not applied)")
    return {"recommendation": advice, "applied": applied, "assumptions": assumptions, "profile": chosen}


def _declared_mix(target_name: str, target_tags: dict[str, str]) -> dict[str, float]:
    """The version's draftsync.task_mix tag as shares; a tag that is not a JSON object of numbers is named."""
    raw = target_tags.get("draftsync.task_mix") or "{}"
    try:
        return {str(task): float(share) for task, share in json.loads(raw).items()}
    except (ValueError, TypeError, AttributeError) as error:
        raise DraftsyncError(
            f"target {target_name}: registry tag draftsync.task_mix={raw!r} is not a JSON object of shares",
            'set it on the version to e.g. {"code": 0.5, "math": 0.5}',
        ) from error


def _parameter_count(target_name: str, target_tags: dict[str, str]) -> int:
    """The version's draftsync.num_parameters tag; missing or not a count, the error says how to set it."""
    raw = target_tags.get("draftsync.num_parameters")
    try:
        return int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise DraftsyncError(
            f"target {target_name}: registry tag draftsync.num_parameters is {'missing' if raw is None else repr(raw)}",
            "register versions with draftsync (it tags them from the checkpoint), or set the draftsync.* target "
            "tags on the version (draftsync.registry.target_tags lists them)",
        ) from error


def recommendation_tags(plan: dict) -> dict[str, str]:
    """The tags a drafter version carries: what was recommended, whether the sync followed it, and why."""
    advice = plan["recommendation"]
    reasons = "\n".join(advice["reasons"] + plan["assumptions"])
    return {f"{RECOMMENDED_PREFIX}method": advice["method"],
            f"{RECOMMENDED_PREFIX}gamma_range": json.dumps(list(advice["gamma_range"])),
            f"{RECOMMENDED_PREFIX}gamma_start": str(advice["gamma_start"]),
            f"{RECOMMENDED_PREFIX}applied": "true" if plan["applied"] else "false",
            f"{RECOMMENDED_PREFIX}reasons": reasons[:4000]}
