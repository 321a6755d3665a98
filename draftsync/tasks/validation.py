"""The `validate-drafter` task: the checklist (validation/runner.py) on the CPU reference engine or on vLLM.

The checklist itself is Prefect-free; this task chooses the evaluation backend and the servers stress runs
against, and hands the checklist the run logger so its sweep and verdict show in the Prefect UI.
"""

from __future__ import annotations

from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from draftsync.profiles import ValidationProfile
from draftsync.serving.evaluation import EvalRequest, EvaluationBackend
from draftsync.tasks import context
from draftsync.validation.checklist import UNSCHEDULED_METHODS
from draftsync.validation.result import ChecklistResult
from draftsync.validation.runner import run_checklist


@task(name="validate-drafter", cache_policy=NONE)
def validate_drafter(
    target_dir: str,
    drafter_dir: str,
    task_mix: dict[str, float],
    profile: ValidationProfile,
    seed: int = 0,
    data_check_failures: int | None = None,
    run_stress: bool = True,
    backend: str = "reference",
) -> ChecklistResult:
    """The checklist on the CPU reference engine, or on vLLM on a GPU worker (`backend="vllm"`); stress runs
    against served instances of the same kind (the reference server, or `vllm serve`)."""
    from draftsync.errors import DraftsyncError
    from draftsync.speculative.drafters import drafter_method
    from draftsync.validation.stress import stress_served_pair

    no_schedule_reason = UNSCHEDULED_METHODS.get(drafter_method(drafter_dir))
    batch_sizes = () if no_schedule_reason else profile.schedule_batch_sizes  # no schedule: no load per batch size

    if backend == "reference":
        from draftsync.serving.evaluation import ReferenceBackend

        chosen: EvaluationBackend = ReferenceBackend(target_dir, drafter_dir)
        _check_pair(chosen, target_dir, drafter_dir)
    elif backend == "vllm":
        from draftsync.serving.vllm_evaluation import VllmBackend

        chosen = VllmBackend(target_dir, drafter_dir)
    else:
        raise DraftsyncError(f"unknown evaluation backend {backend!r}", "use 'reference' (CPU) or 'vllm' (GPU)")
    log_dir = context.settings().root / "serving"

    def stress(gamma: int, requests: list[EvalRequest]) -> dict:
        rate = profile.qps * profile.stress_factor
        return stress_served_pair(
            backend,
            target_dir,
            drafter_dir,
            gamma,
            requests,
            rate,
            profile.stress_concurrency,
            profile.temperature,
            seed,
            log_dir,
            batch_sizes=batch_sizes,
        )

    try:
        return run_checklist(
            chosen,
            target_dir,
            drafter_dir,
            task_mix,
            profile,
            seed,
            data_check_failures,
            stress if run_stress else None,
            no_schedule_reason,
            context.logger(),
        )
    finally:
        chosen.close()


def _check_pair(backend: Any, target_dir: str, drafter_dir: str) -> None:
    from draftsync.errors import DraftsyncError

    if backend.drafter.config.vocab_size != backend.target.config.vocab_size:
        raise DraftsyncError(
            f"drafter {drafter_dir} was built for a vocabulary of {backend.drafter.config.vocab_size} tokens, "
            f"target {target_dir} has {backend.target.config.vocab_size}",
            "train the drafter against this target (draftsync sync)",
        )
