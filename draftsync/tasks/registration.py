"""Registry steps of the loop: publish a target version, fetch one, register, tag, promote and roll back a drafter.

Every registry write a flow makes, and every checkpoint download a sync or validation works from, is a task
here, retried where a retry lands the same as one run; flows read tags and aliases directly.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import task
from prefect.cache_policies import NONE

from draftsync.registry.model_registry import drafter_model_name
from draftsync.registry.tags import (
    CHECKPOINT_TAGS,
    MTP_HEAD_FROM_TAG,
    MTP_HEAD_TAG,
    checklist_tags,
    checkpoint_tags,
    layout_tags,
    target_link_tags,
    training_tags,
)
from draftsync.registry.target_layouts import PLAIN, TargetLayout
from draftsync.tasks import context
from draftsync.validation.result import ChecklistResult, ValidationResult

if TYPE_CHECKING:
    from draftsync.tasks.dataset import TaskMix
    from draftsync.tasks.drafting import Training
    from draftsync.tasks.heads import HeadRefresh
    from draftsync.validation.data_checks import DataCheckReport


@task(name="publish-target", cache_policy=NONE)
def publish_target(
    name: str,
    checkpoint_dir: str,
    task_mix: dict[str, float],
    alias: str = "production",
    flavor: str = PLAIN,
    confine: bool = True,
) -> int:
    """Register a target checkpoint as a new version and point `alias` at it (what a model team does).

    `flavor`: PLAIN logs the checkpoint directory as it is, FLAVOR with the transformers flavor. `confine=False`
    for a path the operator typed, which may lie outside the model roots."""
    from draftsync.registry.model_registry import check_alias
    from draftsync.registry.tags import target_tags
    from draftsync.speculative.targets import describe_target

    registry = context.registry()
    check_alias(alias)  # before the version exists: a refused alias would leave half a registration
    facts = {**describe_target(Path(checkpoint_dir)), "task_mix": task_mix}
    version = registry.register_target(name, Path(checkpoint_dir), target_tags(**facts), flavor=flavor, confine=confine)
    try:
        registry.set_target_alias(name, alias, version)
    except Exception:  # all or nothing: a version without its alias is taken back
        registry.delete_version(name, version)
        raise

    context.logger().info("target %s version %d registered, alias %s", name, version, alias)
    return version


def worth_retrying(task, task_run, state) -> bool:
    """A registry step is retried after an outage or an unexpected error, not after a DraftsyncError that names
    bad input (a layout draftsync cannot read, weights not on the worker): a retry would only say it again."""
    from draftsync.errors import DraftsyncError
    from draftsync.registry.outages import is_outage

    error = state.result(raise_on_failure=False)
    return not isinstance(error, DraftsyncError) or is_outage(error)


@dataclass(frozen=True)
class FetchedTarget:
    """A local copy of a target version: `path` its plain checkpoint directory, `tags` the registry's (what the
    checkpoint and its layout tell filled in where missing), `lineage` the tags that link a drafter to this exact
    target (its MLflow model id, its hub revision), `layout` the layout it was logged in."""

    path: str
    tags: dict[str, str]
    lineage: dict[str, str]
    layout: str


@task(name="fetch-target", retries=2, retry_delay_seconds=5, retry_condition_fn=worth_retrying, cache_policy=NONE)
def fetch_target(name: str, version: int) -> FetchedTarget:
    """A local copy of the target version, whatever layout it was logged in."""
    registry = context.registry()
    layout = registry.checkpoint_layout(name, version)
    tags = fill_target_tags(name, version, layout, registry.version_tags(name, version))
    return FetchedTarget(path=str(layout.path), tags=tags, lineage=target_link_tags(layout), layout=layout.layout)


def fill_target_tags(name: str, version: int, layout: TargetLayout, tags: dict[str, str]) -> dict[str, str]:
    """The version's tags, with the facts it lacks read from its checkpoint and its layout and set on the version.

    A version registered by hand in MLflow has no architecture, size or family tags; its checkpoint tells them
    (`describe_target`, which also refuses a family draftsync does not train for), and an MLmodel its dtype, task
    and transformers version. Tags already there are kept as they are, and the task mix, which no checkpoint tells,
    is never set here."""
    from draftsync.speculative.targets import describe_target

    derived = layout_tags(layout)
    if not all(str(tags.get(key, "")).strip() for key in CHECKPOINT_TAGS):
        facts = describe_target(layout.path)
        facts.pop("task_mix", None)
        derived.update(checkpoint_tags(**facts))
    missing = {key: value for key, value in derived.items() if not str(tags.get(key, "")).strip()}
    if not missing:
        return tags
    registry = context.registry()
    for key, value in missing.items():
        registry.tag_version(name, version, key, value)
    context.logger().info(
        "target %s version %d: tags %s set from its checkpoint", name, version, ", ".join(sorted(missing))
    )
    return {**tags, **missing}


@task(name="fetch-drafter", retries=2, retry_delay_seconds=5, retry_condition_fn=worth_retrying, cache_policy=NONE)
def fetch_drafter(target_name: str, drafter_version: int) -> str:
    """A local copy of the target's drafter version (the checkpoint validated, or a sync's warm start)."""
    return str(context.registry().download(drafter_model_name(target_name), drafter_version))


@task(name="tag-drafter", retries=2, retry_delay_seconds=5, cache_policy=NONE)
def tag_drafter(target_name: str, drafter_version: int, tags: dict[str, str]) -> None:
    """Set these tags on the drafter version; a retry writes the same values again."""
    registry = context.registry()
    for key, value in tags.items():
        registry.tag_version(drafter_model_name(target_name), drafter_version, key, value)


@task(name="register-drafter", retries=2, retry_delay_seconds=5, retry_condition_fn=worth_retrying, cache_policy=NONE)
def register_drafter(
    target_name: str,
    target_version: int,
    drafter_dir: str,
    *,
    target_dir: str,
    method: str,
    gamma: int,
    training: Training | HeadRefresh | None,
    history_path: str | None = None,
    data_checks: DataCheckReport | None = None,
    generation: int = 0,
    target_link: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
    task_mix: TaskMix | None = None,
    mtp_head: str | None = None,
    refreshed_from: int | None = None,
) -> int:
    """Register the drafter (validation pending) with its lineage, training curves, data checks and the sync's plan
    (`params`: run parameters).

    `task_mix`: the mix its data was built for and why, tagged and said in its description. `target_link`
    (fetch_target's `lineage`) ties it to the exact target: its MLflow model id and hub revision. A
    retried sync gets the same version back; a retrain (`generation` > 0) registers a new one. The data checks'
    failures are a tag, so a later `draftsync validate` of this version judges the data-coverage gate without the
    dataset. `mtp_head` (shipped | refreshed) registers the target's own head, `refreshed_from` naming the shipped
    head's version a refresh started from; each has its own sync key. A drafter built for another vocabulary or hidden
    size than the target in `target_dir` is refused, and nothing is registered."""
    from draftsync.speculative.methods.registry import check_drafter_fits_target

    check_drafter_fits_target(drafter_dir, target_dir)
    registry = context.registry()
    history = json.loads(Path(history_path).read_text()) if history_path and Path(history_path).exists() else None
    failures = len(data_checks.failures) if data_checks is not None else None
    mix, source = (task_mix.shares, task_mix.source) if task_mix is not None else (None, "")
    summary = training.as_dict() if training is not None else {}
    tags = {**training_tags(summary, generation, failures, mix, source), **(target_link or {})}
    if mtp_head is not None:
        tags[MTP_HEAD_TAG] = mtp_head
    if refreshed_from is not None:
        tags[MTP_HEAD_FROM_TAG] = str(refreshed_from)
    version = registry.register_drafter(
        target_name,
        target_version,
        Path(drafter_dir),
        method,
        gamma,
        {},
        extra_tags=tags,
        validation_passed=None,
        metric_history=history,
        params=params,
        sync_key=f"{target_name}:{target_version}:{method}"
        + (f":{mtp_head}" if mtp_head else "")
        + (f":g{generation}" if generation else ""),
    )
    context.logger().info("drafter version %d registered for %s v%d", version, target_name, target_version)
    return version


def validation_metrics(checklist: ChecklistResult) -> tuple[dict[str, float], dict[str, list[tuple[int, float]]]]:
    """MLflow metrics of a validation, and the gamma sweep as step series (step = gamma) for the run's charts."""
    metrics = {f"acceptance_{k}": v for k, v in asdict(checklist.acceptance).items()}
    metrics.update(
        {
            "acceptance_greedy": checklist.acceptance_greedy,
            "mean_acceptance_length": checklist.mean_acceptance_length,
            "tpot_ms_spec": checklist.tpot_ms.spec,
            "tpot_ms_plain": checklist.tpot_ms.plain,
            "speedup": checklist.speedup,
            "gamma_knee": checklist.gamma_knee,
            "memory_overhead": checklist.memory.overhead,
            **{f"acceptance_pos{i}": v for i, v in enumerate(checklist.acceptance_by_position)},
        }
    )
    if checklist.stress:
        metrics["stress_speedup"] = checklist.stress["speedup"]
        metrics["stress_errors"] = checklist.stress["errors"]
    sweep = {
        f"sweep.{key}": [(row["gamma"], row[key]) for row in checklist.gamma_sweep]
        for key in ("mean_acceptance_length", "acceptance_rate", "tpot_ms")
    }
    return metrics, sweep


@task(name="record-validation", retries=2, retry_delay_seconds=5, cache_policy=NONE)
def record_validation(result: ValidationResult, mismatch_threshold: float) -> None:
    """The verdict, gates, knee and baseline onto the drafter version; plots and tables onto its run."""
    checklist = result.checklist
    metrics, sweep = validation_metrics(checklist)
    # the production guide's baseline for the next iteration: the best gamma's acceptance and the live threshold
    tags = checklist_tags(
        ((g.name, g.passed) for g in checklist.gates),
        profile=checklist.profile,
        backend=checklist.backend,
        temperature=checklist.temperature,
        acceptance_rate=checklist.acceptance.mean,
        threshold=mismatch_threshold,
        schedule=checklist.speculation_schedule,
        gamma_reason=checklist.knee_reason,
        prediction=checklist.prediction.as_dict() if checklist.prediction else None,
        draft_sampling=checklist.draft_sampling.chosen if checklist.draft_sampling else None,
    )
    context.registry().record_validation(
        result.target_name,
        result.drafter_version,
        passed=result.passed,
        metrics=metrics,
        tags=tags,
        failed_gates=checklist.failed_gates,
        gamma=checklist.gamma_knee,
        reports_dir=Path(result.reports_dir),
        metric_history=sweep,
    )


@task(name="promote-drafter", retries=2, retry_delay_seconds=5, cache_policy=NONE)
def promote_drafter(target_name: str, drafter_version: int) -> None:
    """Retried like the other registry steps: the alias writes land the same however often they run."""
    context.registry().promote(target_name, drafter_version)


@task(name="restore-drafter-aliases", retries=2, retry_delay_seconds=5, cache_policy=NONE)
def restore_drafter_aliases(target_name: str, snapshot: dict[str, int | None]) -> None:
    """Point the drafter's aliases back where `snapshot` says; a retry lands the same."""
    context.registry().restore_aliases(target_name, snapshot)
