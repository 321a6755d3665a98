"""The `validate-drafter` task: the checklist (validation/runner.py) on the CPU reference engine or on vLLM.

The checklist itself is Prefect-free; this task chooses the evaluation backend (whose servers stress loads too) and
hands the checklist the run logger so its sweep and verdict show in the Prefect UI. Its requests end at the target's
EOS, as served requests do: tokens past the end of an answer are no traffic a drafter was trained for, and a prompt the
target answers at once would otherwise weigh in the per-request P5 with the drafter's guesses at what follows an end.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NONE

from draftsync.profiles import ValidationProfile
from draftsync.serving.evaluation import EvaluationBackend
from draftsync.serving.traffic_capture import CapturedPrompt
from draftsync.tasks import context
from draftsync.validation.checklist import unscheduled_reason
from draftsync.validation.result import ChecklistResult
from draftsync.validation.runner import run_checklist


@task(name="validate-drafter", cache_policy=NONE)
def validate_drafter(
    target_dir: str,
    drafter_dir: str,
    task_mix: dict[str, float],
    profile: ValidationProfile,
    *,
    seed: int = 0,
    data_check_failures: int | None = None,
    run_stress: bool = True,
    backend: str | None = None,
    servers: dict | None = None,
    captured_prompts: list[CapturedPrompt] | None = None,
) -> ChecklistResult:
    """The checklist on real vLLM servers or on the CPU reference engine (`backend`, default the profile's: see
    `evaluation_backend`); stress runs against served instances of the same kind (the reference server, or vLLM).
    `servers`: the GPUs a sync's plan gives its vLLM servers (devices, tensor parallelism, memory fraction).
    `captured_prompts`: held-out prompts of the traffic a retrain learnt from, validated on as well."""
    from draftsync.speculative.methods.registry import check_drafter_fits_target, drafter_method

    check_drafter_fits_target(drafter_dir, target_dir)
    backend = evaluation_backend(backend or profile.backend, profile.temperature)
    no_schedule_reason = unscheduled_reason(drafter_method(drafter_dir))
    # The schedule needs real batching: none from the reference server, which answers one request at a time (its
    # levels would measure queueing); a method served without one gets none either (run_checklist).
    batch_sizes = () if backend == "reference" else profile.schedule_batch_sizes
    log_dir = context.settings().root / "serving"
    if backend == "reference":
        from draftsync.serving.evaluation import ReferenceBackend

        chosen: EvaluationBackend = ReferenceBackend(target_dir, drafter_dir, log_dir=log_dir, ignore_eos=False)
    else:
        from draftsync.serving.vllm_args import ServerResources
        from draftsync.serving.vllm_evaluation import VllmBackend

        chosen = VllmBackend(
            target_dir,
            drafter_dir,
            log_dir=log_dir,
            draft_sampling=profile.draft_sampling,
            ignore_eos=False,
            resources=ServerResources.from_plan(servers),
        )
    context.logger().info("validating on the %s backend", backend)
    try:
        return run_checklist(
            chosen,
            target_dir,
            drafter_dir,
            task_mix,
            profile,
            seed=seed,
            data_check_failures=data_check_failures,
            run_stress=run_stress,
            batch_sizes=batch_sizes,
            no_schedule_reason=no_schedule_reason,
            logger=context.logger(),
            monitor_line=max(context.settings().stale_threshold, context.settings().mismatch_threshold),
            captured_prompts=captured_prompts or (),
        )
    finally:
        chosen.close()


def evaluation_backend(name: str, temperature: float = 0.0) -> str:
    """ "vllm" or "reference" for a backend setting. "auto" is vLLM whenever an engine is installed that measures
    speculation at the deployment's `temperature` as it serves it (vLLM's CPU build samples drafts unsoundly above
    0: see `VllmEngine.sampled_speculation_fault`); an explicit "vllm" there fails at its first sampled request."""
    from draftsync.errors import DraftsyncError
    from draftsync.serving.vllm_engine import find_vllm_engine

    if name == "auto":
        engine = find_vllm_engine(required=False)
        if engine is None:
            return "reference"
        fault = engine.sampled_speculation_fault() if temperature > 0 else None
        if fault is not None:
            context.logger().info("the reference backend measures temperature %g here: %s", temperature, fault)
            return "reference"
        return "vllm"
    if name not in ("vllm", "reference"):
        raise DraftsyncError(
            f"unknown evaluation backend {name!r}",
            "use 'vllm' (real vLLM servers), 'reference' (the CPU reference engine) or 'auto'",
        )
    return name
