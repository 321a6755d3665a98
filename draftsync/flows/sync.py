"""The drafter sync: dataset from the target -> train -> register with lineage -> validate -> promote.

A target version that ships its own MTP head is synced through that head instead (`_sync_head`): the head as shipped
is registered and validated first; it serves if it passes and scores no worse than the pair serving now, else it is
refreshed on the version's own answers and the better of the two that pass is promoted.

The drafter is registered before it is validated (as a `candidate`, validation pending), so a crash
during the checklist leaves a version a rerun finds again by its sync key and validates, and the
checklist's plots and tables land on that version's run.

Each sync first claims its job in the ledger (target, version, method): a duplicate event, a second
watcher or a hand-started run of a version already synced trains nothing. A job whose run died (its
Prefect run is over, or its process on this host is gone) is taken over and resumed.
"""

from __future__ import annotations

import shutil
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prefect import flow, get_run_logger

from draftsync.flows.validate import promote_validated, validate
from draftsync.profiles import SyncProfile
from draftsync.profiles import profile as named_profile
from draftsync.records import record_dict
from draftsync.registry.model_registry import PRODUCTION, drafter_model_name
from draftsync.registry.tags import (
    BASELINE_ACCEPTANCE_TAG,
    MTP_HEAD_VERDICT_TAG,
    REFRESHED_HEAD,
    SHIPPED_HEAD,
    TargetVersion,
)
from draftsync.speculative.methods import MTP
from draftsync.speculative.placement import release_shared_targets
from draftsync.tasks import context, links
from draftsync.tasks.dataset import DatasetBuild, build_dataset, target_task_mix
from draftsync.tasks.drafting import HISTORY_FILE, SpeculatorsTrainingSummary, Training, train_drafter
from draftsync.tasks.heads import HeadRefresh, refresh_shipped_head, save_shipped_head
from draftsync.tasks.planning import Advice, plan_drafter, plan_sync_resources, recommendation_tags
from draftsync.tasks.registration import fetch_drafter, fetch_target, register_drafter, tag_drafter
from draftsync.tasks.sync_requests import owner_is_gone, run_owner, sync_method
from draftsync.validation.result import ValidationResult

if TYPE_CHECKING:
    from draftsync.planning.sync_plan import SyncPlan
    from draftsync.serving.traffic_capture import CapturedPrompt
    from draftsync.speculative.placement import TargetPlacement
    from draftsync.tasks.registration import FetchedTarget


@dataclass(frozen=True)
class SyncResult:
    """What a sync trained and how it validated. `as_dict()` is the flow's return value and `draftsync sync
    --json`: its keys are what users read, so they change only with a note to them."""

    target_name: str
    target_version: int
    drafter_name: str
    drafter_version: int
    method: str
    gamma: int  # the knee validation measured
    recommendation: Advice  # the decision framework's advice, whether it was applied, and its assumptions
    passed: bool
    validation: ValidationResult
    training: Training | HeadRefresh | None  # a target's own head: its refresh, None when it served as shipped
    dataset: DatasetBuild | None  # its data checks are the result's `data_checks`; None for a target's own head
    stages_s: dict[str, float]
    generation: int = 0
    plan: SyncPlan | None = None  # the resource plan the sync followed (planning/sync_plan.py)
    mtp_head: HeadVerdict | None = None  # a target's own head: what was measured, and why the one serving serves

    def as_dict(self) -> dict[str, Any]:
        """The fields in their order, each step's result as its own dict; the dataset's checks follow it."""
        return record_dict(
            self,
            after={"dataset": {"data_checks": None if self.dataset is None else self.dataset.checks.to_dict()}},
            recommendation=self.recommendation.as_dict(),
            validation=self.validation.as_dict(),
            training=None if self.training is None else self.training.as_dict(),
            dataset=None if self.dataset is None else self.dataset.as_dict(),
            plan=None if self.plan is None else self.plan.to_dict(),
            mtp_head=None if self.mtp_head is None else self.mtp_head.as_dict(),
        )


@dataclass(frozen=True)
class HeadVerdict:
    """A target's own head in its sync: each head measured (drafter version, acceptance, gates passed), the pair that
    served before, and which head the sync promoted and why (None: neither passed)."""

    shipped_version: int
    shipped_acceptance: float
    shipped_passed: bool
    served_before: float | None  # the acceptance validation measured for the pair in production before this sync
    refreshed_version: int | None = None
    refreshed_acceptance: float | None = None
    refreshed_passed: bool | None = None
    promoted: str | None = None  # shipped | refreshed | None
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return record_dict(self)


@dataclass(frozen=True)
class SkippedSync:
    """A sync the ledger did not let run: `skipped` says why (synced already, or another live run has it)."""

    target_name: str
    target_version: int
    method: str
    skipped: str
    drafter_version: int | None
    run_id: str | None

    def as_dict(self) -> dict[str, Any]:
        return record_dict(self)


@flow(name="drafter-sync", log_prints=True)
def sync(
    target_name: str,
    target_version: int,
    profile: str | SyncProfile | None = None,
    reason: str = "sync started directly",
) -> dict:
    """Train a drafter for one target version; promote it to `production` only when every gate passes.

    `profile` None: the configured one (DRAFTSYNC_SYNC_PROFILE). Returns `skipped` when the ledger says the
    version is synced already or another live run has it."""
    context.require_settings("drafter-sync", "registry", "store")
    logger = get_run_logger()
    chosen = (
        named_profile(profile or context.settings().sync_profile) if not isinstance(profile, SyncProfile) else profile
    )
    method = sync_method(target_name, target_version, chosen.method)
    claim = _claim(target_name, target_version, method, reason)
    if claim.outcome != "claimed":
        job = claim.job
        logger.info("sync of %s v%d (%s) skipped: %s", target_name, target_version, method, claim.outcome)
        return SkippedSync(
            target_name, target_version, method, claim.outcome, job.drafter_version, job.run_id
        ).as_dict()
    job = claim.job
    if job.generation:  # a retrain of the same target version: fresh data and a fresh drafter version
        chosen = chosen.model_copy(update={"seed": chosen.seed + job.generation})
    try:
        if method == MTP.name:
            target = fetch_target(target_name, target_version)
            result = _sync_head(target_name, target_version, chosen, job.generation, target)
        else:
            result = _train_and_validate(target_name, target_version, chosen, job.generation)
    except BaseException as error:
        detail = "".join(traceback.format_exception_only(error)).strip()[:2000]
        context.sync_ledger().finish(job.id, "failed", detail=detail)
        raise
    finally:
        release_shared_targets()
    context.sync_ledger().finish(
        job.id,
        "succeeded",
        drafter_version=result.drafter_version,
        detail="passed" if result.passed else "failed validation",
    )
    _summary_artifact(result, reason)
    return result.as_dict()


def _training_line(training: Training | HeadRefresh | None) -> str:
    if training is None:
        return "Training: none, the head served as the target version shipped it."
    if isinstance(training, HeadRefresh):
        return (
            f"Training: the shipped MTP head refreshed on {training.samples} of the target's answers, "
            f"{training.steps} steps, loss {training.first_loss} to {training.final_loss}, {training.seconds} s."
        )
    warm = " (warm start)" if training.warm_start else ""
    if isinstance(training, SpeculatorsTrainingSummary):
        return f"Training: speculators, {training.epochs} epochs{warm}, {training.seconds} s."
    return (
        f"Training: {training.steps} steps{warm}, final loss\n{training.final_loss}, "
        f"{training.tokens_per_s} tokens/s, {training.parameters_pct_of_target}% of the target."
    )


def _summary_artifact(result: SyncResult, reason: str) -> None:
    """The sync's page in the Prefect UI: what was trained, the gates, and where to look next."""
    from prefect.artifacts import create_markdown_artifact

    target, version = result.target_name, result.target_version
    validation, training, advice = result.validation, result.training, result.recommendation.recommendation
    rows = "\n".join(
        f"| {g.name} | {g.reported_value} | {g.comparison} {g.threshold} | {'pass' if g.passed else '**FAIL**'} |"
        for g in validation.checklist.gates
    )
    head_line = "" if result.mtp_head is None else f"\nThe target's own MTP head: {result.mtp_head.reason}.\n"
    verdict = (
        "passed every gate and is `production`"
        if validation.promoted
        else ("passed" if result.passed else "**failed** validation and stays a candidate")
    )
    markdown = f"""# Drafter sync: {target} v{version}

Drafter **{result.drafter_name} v{result.drafter_version}** ({result.method}, gamma knee
{result.gamma}) {verdict}. Started by: {reason}.

Gamma: recommended {advice.gamma_range[0]}-{advice.gamma_range[1]} starting at {advice.gamma_start}
({advice.method}{", followed" if result.recommendation.applied else ", recorded only"}); measured knee {result.gamma}.

{_training_line(training)}
{head_line}
| gate | value | threshold | result |
|---|---|---|---|
{rows}

- [Drafter version in MLflow]({links.model_version_url(result.drafter_name, result.drafter_version)})
- [Target version in MLflow]({links.model_version_url(target, version)})
- [This flow run]({links.current_run_url()})
"""
    key = f"sync-{target}-v{version}".lower().replace("_", "-").replace(".", "-")
    create_markdown_artifact(key=key, markdown=markdown, description=f"drafter sync of {target} v{version}")


def _claim(target_name: str, target_version: int, method: str, reason: str):
    ledger = context.sync_ledger()
    owner = run_owner()
    claim = ledger.claim(target_name, target_version, method, run_id=owner, reason=reason)
    if (
        claim.outcome == "running"
        and claim.job.status == "running"
        and claim.job.run_id != owner
        and owner_is_gone(claim.job.run_id)
    ):
        get_run_logger().warning(
            "sync of %s v%d: run %s died; taking its job over", target_name, target_version, claim.job.run_id
        )
        claim = ledger.claim(
            target_name, target_version, method, run_id=owner, reason=reason, takeover_from=claim.job.run_id
        )
    return claim


def _retrain_prompts(target_name: str, profile: SyncProfile) -> tuple[list[str], list[CapturedPrompt]]:
    """A retrain learns from the traffic that went stale: the prompts its deployments captured, when there are
    enough of them, as (to train on, held out to validate on, replayed at the output length each client asked for);
    else it says why and trains on the declared task mix."""
    import random

    from draftsync.tasks.serving import captured_prompts

    captured, where = captured_prompts(target_name)
    # a prompt sent many times teaches the drafter once (in the order first sent; replayed as last sent)
    distinct = list({p.text: p for p in captured}.values())
    if len(distinct) < profile.min_captured_prompts:
        context.logger().info(
            "retrain of %s on the declared task mix: %d distinct captured prompts, fewer than the %d it needs (%s)",
            target_name,
            len(distinct),
            profile.min_captured_prompts,
            where,
        )
        return [], []
    random.Random(profile.seed + 300).shuffle(distinct)
    held = round(profile.captured_holdout * len(distinct))
    context.logger().info(
        "retrain of %s answers captured traffic: %s; %d distinct prompts held out for validation",
        target_name,
        where,
        held,
    )
    return [p.text for p in distinct[held:]], distinct[:held]


class _Stopwatch:
    """Each stage's seconds, in the order the stages ran (a sync's `stages_s`)."""

    def __init__(self) -> None:
        self.stages: dict[str, float] = {}
        self._clock = time.perf_counter()

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.stages[stage] = round(now - self._clock, 2)
        self._clock = now


def _train_and_validate(target_name: str, target_version: int, chosen: SyncProfile, generation: int) -> SyncResult:
    logger = get_run_logger()
    settings = context.settings()
    watch = _Stopwatch()

    target = fetch_target(target_name, target_version)
    if TargetVersion.from_tags(target_name, target_version, target.tags).mtp_head():  # its tags filled only now
        return _sync_head(target_name, target_version, chosen, generation, target)
    plan = plan_drafter(target_name, target.tags, chosen)
    chosen = plan.profile
    mix = target_task_mix(Path(target.path), target.tags, chosen.default_task_mix)
    task_mix = mix.shares
    logger.info("task mix of %s v%d: %s", target_name, target_version, mix.text())
    # Refused here, before a byte is written, when a stage cannot fit this worker; else the sync follows it.
    resources = plan_sync_resources(target_name, target.path, mix, chosen)
    chosen = chosen.model_copy(update=resources.profile_updates())
    placement, servers = resources.placement(), resources.settings.get("servers")
    rank_devices = resources.settings.get("training_devices", [])
    # One work directory per (target version, method): a rerun after a crash resumes the dataset build
    # from its last shard and the training from its last checkpoint.
    suffix = f"-g{generation}" if generation else ""
    work = settings.root / "syncs" / target_name / f"v{target_version}-{chosen.method}{suffix}"
    dataset_dir = work / f"dataset-{chosen.dataset_key()}"
    captured, held_out = _retrain_prompts(target_name, chosen) if generation else ([], [])
    if captured and chosen.captured_share > 0:  # it learns the traffic: a new distribution, even warm-started
        chosen = chosen.model_copy(update={"warm_start_steps": chosen.train_steps})
    watch.lap("preparation")
    states_server = resources.settings.get("hidden_states_server")
    data = build_dataset(target.path, task_mix, chosen, str(dataset_dir), placement, servers, captured, states_server)
    watch.lap("dataset")

    out_dir = settings.root / "drafters" / target_name / f"target-v{target_version}-{chosen.method}{suffix}"
    checkpoints = work / "checkpoints"
    training = _train(
        target_name,
        target.path,
        data,
        chosen,
        str(out_dir),
        str(checkpoints),
        placement,
        servers,
        rank_devices,
        states_server,
    )
    watch.lap("training")
    version = register_drafter(
        target_name,
        target_version,
        str(out_dir),
        target_dir=target.path,
        method=chosen.method,
        gamma=chosen.gamma,
        training=training,
        history_path=str(checkpoints / HISTORY_FILE),
        data_checks=data.checks,
        generation=generation,
        target_link=target.lineage,
        params=resources.run_params(),
        task_mix=mix,
    )
    tag_drafter(target_name, version, recommendation_tags(plan.advice))
    if not chosen.keep_dataset:
        shutil.rmtree(dataset_dir, ignore_errors=True)
    watch.lap("registration")
    validation = validate(
        target_name,
        version,
        chosen.validation,
        promote=True,
        seed=chosen.seed,
        servers=servers,
        captured_prompts=held_out or None,
    )
    watch.lap("validation")
    drafter_model = drafter_model_name(target_name)
    if not validation.passed:
        logger.warning("drafter %s v%d stays a candidate and does not serve", drafter_model, version)
    return SyncResult(
        target_name=target_name,
        target_version=target_version,
        drafter_name=drafter_model,
        drafter_version=version,
        method=chosen.method,
        gamma=validation.checklist.gamma_knee,
        recommendation=plan.advice,
        passed=validation.passed,
        validation=validation,
        training=training,
        dataset=data,
        stages_s=watch.stages,
        generation=generation,
        plan=resources,
    )


def _sync_head(
    target_name: str, target_version: int, chosen: SyncProfile, generation: int, target: FetchedTarget
) -> SyncResult:
    """The head the target version ships, measured and registered; refreshed when it fails its gates or scores under
    the pair serving now; the better head that passes promoted, the other tagged with the reason it was not."""
    logger = get_run_logger()
    watch = _Stopwatch()
    plan = plan_drafter(target_name, target.tags, chosen)
    mix = target_task_mix(Path(target.path), target.tags, chosen.default_task_mix)
    resources = plan_sync_resources(target_name, target.path, mix, chosen)  # refuses a head it cannot refresh
    servers = resources.settings.get("servers")
    suffix = f"-g{generation}" if generation else ""
    out_dir = context.settings().root / "drafters" / target_name / f"target-v{target_version}-{MTP.name}{suffix}"

    def register(drafter_dir: str, refresh: HeadRefresh | None, head: str, refreshed_from: int | None = None) -> int:
        version = register_drafter(
            target_name,
            target_version,
            drafter_dir,
            target_dir=target.path,
            method=MTP.name,
            gamma=chosen.gamma,
            training=refresh,
            generation=generation,
            target_link=target.lineage,
            params=resources.run_params(),
            task_mix=mix,
            mtp_head=head,
            refreshed_from=refreshed_from,
        )
        tag_drafter(target_name, version, recommendation_tags(plan.advice))
        return version

    served_before = _served_acceptance(target_name)
    # a retrain learns the traffic that went stale, and holds the head to its held-out prompts too
    captured, held_out = _retrain_prompts(target_name, chosen) if generation else ([], [])
    watch.lap("preparation")

    shipped_dir = save_shipped_head(target.path, str(out_dir / SHIPPED_HEAD), chosen.gamma)
    shipped_version = register(shipped_dir, None, SHIPPED_HEAD)
    watch.lap("registration")
    shipped = validate(
        target_name, shipped_version, chosen.validation, seed=chosen.seed, servers=servers, captured_prompts=held_out
    )
    watch.lap("validation")
    measured = HeadVerdict(shipped_version, shipped.checklist.acceptance.mean, shipped.passed, served_before)
    stale = stale_head(measured, shipped.checklist.failed_gates + shipped.suite.failed)
    if stale is None:
        verdict = choose_head(measured, stale)
        serving = promote_validated(shipped)
        return _head_result(target_name, target_version, serving, None, verdict, plan, watch, resources, generation)

    logger.warning("the MTP head %s v%d shipped is stale (%s): refreshing it", target_name, target_version, stale)
    refreshed_dir = str(out_dir / REFRESHED_HEAD)
    refresh = refresh_shipped_head(target.path, mix.shares, chosen, refreshed_dir, chosen.gamma, captured)
    watch.lap("refresh")
    refreshed_version = register(refreshed_dir, refresh, REFRESHED_HEAD, shipped_version)
    refreshed = validate(
        target_name, refreshed_version, chosen.validation, seed=chosen.seed, servers=servers, captured_prompts=held_out
    )
    watch.lap("refresh validation")
    verdict = choose_head(
        replace(
            measured,
            refreshed_version=refreshed_version,
            refreshed_acceptance=refreshed.checklist.acceptance.mean,
            refreshed_passed=refreshed.passed,
        ),
        stale,
    )
    if verdict.promoted == REFRESHED_HEAD:
        serving = promote_validated(refreshed)
        tag_drafter(target_name, shipped_version, {MTP_HEAD_VERDICT_TAG: f"not promoted: {stale}"})
    else:
        tag_drafter(target_name, refreshed_version, {MTP_HEAD_VERDICT_TAG: verdict.reason})
        logger.warning("the MTP head of %s v%d: %s", target_name, target_version, verdict.reason)
        serving = promote_validated(shipped) if verdict.promoted == SHIPPED_HEAD else refreshed
    return _head_result(target_name, target_version, serving, refresh, verdict, plan, watch, resources, generation)


def stale_head(measured: HeadVerdict, failed: list[str]) -> str | None:
    """Why the shipped head needs a refresh (it failed a gate, or scores under the pair serving now); None: it
    serves as shipped."""
    if not measured.shipped_passed:
        return f"it failed {', '.join(failed) or 'validation'}"
    before = measured.served_before
    if before is not None and measured.shipped_acceptance < before:
        return f"acceptance {measured.shipped_acceptance:.3f} under the pair serving before ({before:.3f})"
    return None


def choose_head(measured: HeadVerdict, stale: str | None) -> HeadVerdict:
    """Which head serves, and why: the shipped head unless it is stale; then the refreshed one if it passes and
    scores above the shipped one, else the shipped one if it passed, else neither."""
    shipped = measured.shipped_acceptance
    if stale is None:
        before = "" if measured.served_before is None else f", the pair serving before {measured.served_before:.3f}"
        reason = f"served as shipped: it passed every gate at acceptance {shipped:.3f}{before}"
        return replace(measured, promoted=SHIPPED_HEAD, reason=reason)
    refreshed = measured.refreshed_acceptance
    if refreshed is None:
        raise ValueError("a stale head's verdict needs its refresh measured")
    scores = f"refreshed {refreshed:.3f} against shipped {shipped:.3f}"
    if measured.refreshed_passed and refreshed > shipped:
        return replace(
            measured, promoted=REFRESHED_HEAD, reason=f"refreshed, as the shipped head was stale ({stale}): {scores}"
        )
    why = "it failed its gates" if not measured.refreshed_passed else "its acceptance is not above the shipped head's"
    not_promoted = f"a refreshed head under the shipped one is not promoted: {why} ({scores})"
    if measured.shipped_passed:
        return replace(measured, promoted=SHIPPED_HEAD, reason=f"served as shipped, though {stale}: {not_promoted}")
    return replace(
        measured, promoted=None, reason=f"neither head serves: the shipped one was stale ({stale}); {not_promoted}"
    )


def _served_acceptance(target_name: str) -> float | None:
    """The acceptance validation measured for the pair in production now (None: none serves, or none recorded)."""
    registry = context.registry()
    name = drafter_model_name(target_name)
    version = registry.alias_version(name, PRODUCTION)
    if version is None:
        return None
    recorded = registry.version_tags(name, version).get(BASELINE_ACCEPTANCE_TAG)
    return float(recorded) if recorded else None


def _head_result(
    target_name: str,
    target_version: int,
    validation: ValidationResult,
    refresh: HeadRefresh | None,
    verdict: HeadVerdict,
    plan: Any,
    watch: _Stopwatch,
    resources: SyncPlan,
    generation: int,
) -> SyncResult:
    get_run_logger().info("the MTP head of %s v%d: %s", target_name, target_version, verdict.reason)
    return SyncResult(
        target_name=target_name,
        target_version=target_version,
        drafter_name=drafter_model_name(target_name),
        drafter_version=validation.drafter_version,
        method=MTP.name,
        gamma=validation.checklist.gamma_knee,
        recommendation=plan.advice,
        passed=verdict.promoted is not None,
        validation=validation,
        training=refresh,
        dataset=None,
        stages_s=watch.stages,
        generation=generation,
        plan=resources,
        mtp_head=verdict,
    )


def _train(
    target_name: str,
    target_dir: str,
    data: DatasetBuild,
    chosen: SyncProfile,
    out_dir: str,
    checkpoints: str,
    placement: TargetPlacement | None,
    servers: dict[str, Any] | None,
    rank_devices: list[int],
    states_server: dict[str, Any] | None = None,
) -> Training:
    """Train the drafter, warm-started from the one in production when there is one; the target's memory goes back
    before the validation servers start."""
    previous = context.registry().alias_version(drafter_model_name(target_name), PRODUCTION)
    warm_start_dir = fetch_drafter(target_name, previous) if previous is not None else None
    try:
        return train_drafter(
            target_dir,
            data.path,
            chosen,
            out_dir,
            checkpoints,
            warm_start_dir=warm_start_dir,
            placement=placement,
            servers=servers,
            rank_devices=rank_devices,
            states_server=states_server,
        )
    finally:
        release_shared_targets()
