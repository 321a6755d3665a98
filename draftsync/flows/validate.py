"""The `validate-drafter` flow: the checklist on one registered drafter version, its results on the version.

It runs inside every sync (before promotion) and on its own (`draftsync validate`). Against the target
version the drafter was trained for, the verdict, gates and baseline gamma go onto the drafter version
and a pass may promote it. Against another target version it is a cross-check ("does the old drafter
still fit the new target?"): the result is reported and tagged `draftsync.crosscheck.target_v<N>`, and
the drafter's own verdict is left alone. A failed gate never moves `production`.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import replace
from pathlib import Path

from prefect import flow
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from draftsync.profiles import EVEN_TASK_MIX, ValidationProfile, validation_profile
from draftsync.registry.model_registry import drafter_model_name
from draftsync.registry.tags import DrafterVersion, crosscheck_tag
from draftsync.serving.traffic_capture import CapturedPrompt
from draftsync.tasks import context, events
from draftsync.tasks.dataset import target_task_mix
from draftsync.tasks.registration import (
    fetch_drafter,
    fetch_target,
    promote_drafter,
    record_validation,
    tag_drafter,
)
from draftsync.tasks.validation import validate_drafter
from draftsync.validation.result import ChecklistResult, ValidationResult


def _number(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _gamma_label(gamma: int, checklist: ChecklistResult) -> str:
    """A sweep row's gamma as the report names it: the knee, or a gamma validated and stepped down from."""
    if gamma == checklist.gamma_knee:
        return f"{gamma} (knee)"
    failed = next((r["failed_gates"] for r in checklist.gammas_rejected if r["gamma"] == gamma), None)
    return f"{gamma} (validated, failed {', '.join(failed)})" if failed else str(gamma)


def _markdown(result: ValidationResult) -> str:
    checklist = result.checklist
    gates = "\n".join(
        f"| {g.name} | {_number(g.reported_value)} | {g.comparison} {_number(g.threshold)} | "
        f"{'pass' if g.passed else '**FAIL**'} | {g.detail} |"
        for g in checklist.gates
    )
    sweep = "\n".join(
        f"| {_gamma_label(r['gamma'], checklist)} | "
        f"{r['mean_acceptance_length']:.3f} | {r['acceptance_rate']:.3f} | {r['tpot_ms']:.3f} |"
        for r in checklist.gamma_sweep
    )
    a, tpot = checklist.acceptance, checklist.tpot_ms
    verdict = "PASSED" if result.passed else "FAILED: " + ", ".join(checklist.failed_gates + result.suite.failed)
    return (
        f"# {result.drafter_name} v{result.drafter_version} on {result.target_name} v{result.target_version}: "
        f"{verdict}\n\n"
        f"Profile `{checklist.profile}`, backend `{checklist.backend}`"
        + (f" ({checklist.requests.engine_starts} engine starts)" if checklist.requests.engine_starts else "")
        + f", temperature {checklist.temperature:g}, {checklist.requests.validation} validation requests.\n\n"
        f"| gate | value | threshold | verdict | measured |\n|---|---|---|---|---|\n{gates}\n\n"
        f"Per-request acceptance: mean {_number(a.mean)}, P5 {_number(a.p5)}, P50 {_number(a.p50)}, "
        f"P90 {_number(a.p90)}, P99 {_number(a.p99)}. TPOT {tpot.spec:.3f} ms with speculation, "
        f"{tpot.plain:.3f} ms without ({checklist.speedup:.2f}x).\n\n"
        f"## Gamma sweep (plain decoding {checklist.sweep_plain_tpot_ms:.3f} ms)\n\n"
        f"Served: gamma {checklist.gamma_knee}, because {checklist.knee_reason}.\n\n"
        f"| gamma | mean acceptance length | acceptance rate | TPOT ms |\n|---|---|---|---|\n{sweep}\n"
        + _schedule_markdown(checklist)
    )


def _schedule_markdown(checklist: ChecklistResult) -> str:
    """The measured per-batch-size schedule and, where vLLM was relaunched with it, how it did against plain."""
    if not checklist.speculation_schedule:
        return ""
    lines = [
        f"\n## Speculation per batch size\n\n`num_speculative_tokens_per_batch_size`: {checklist.speculation_schedule}"
    ]
    stress = checklist.stress or {}
    check = stress.get("schedule_check")
    if check:
        lines.append(
            "\n| concurrency | k relaunched | relaunched ms/token | speculative ms/token | plain ms/token "
            "| plain / relaunched |\n|---|---|---|---|---|---|"
        )
        for size, level in check.items():
            lines.append(
                f"| {size} | {level.get('k', '')} | {_number(level['scheduled_ms_per_token'])} "
                f"| {_number(level.get('speculative_ms_per_token'))} | {_number(level['plain_ms_per_token'])} "
                f"| {_number(level['speedup'])} |"
            )
    if stress.get("schedule_note"):
        lines.append(f"\nRevised from {stress['schedule_measured']}: {stress['schedule_note']}.")
    return "\n".join(lines) + "\n"


def _write_reports(result: ValidationResult) -> None:
    """What a reviewer opens in the MLflow UI: the result, the per-request table, the suite, two plots."""
    from draftsync.validation.plots import write_validation_plots

    out, checklist = Path(result.reports_dir), result.checklist
    out.mkdir(parents=True, exist_ok=True)
    rows = checklist.rows
    (out / "validation.json").write_text(json.dumps(result.report_dict(), indent=2, default=str))
    with (out / "requests.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "suite.json").write_text(json.dumps(result.suite.as_dict(), indent=2, default=str))
    write_validation_plots(out, checklist)


def promote_validated(result: ValidationResult) -> ValidationResult:
    """Make a drafter that passed its checklist on the target it was trained for `production`, and say so."""
    checklist = result.checklist
    promote_drafter(result.target_name, result.drafter_version)
    events.emit(
        events.DRAFTER_VALIDATED,
        result.target_name,
        result.target_version,
        drafter_version=str(result.drafter_version),
        payload={"gamma_knee": checklist.gamma_knee, "speedup": checklist.speedup},
    )
    context.logger().info(
        "drafter %s v%d passed every gate and is now production", result.drafter_name, result.drafter_version
    )
    return replace(result, promoted=True)


@flow(name="validate-drafter", log_prints=True)
def validate(
    target_name: str,
    drafter_version: int,
    profile: str | ValidationProfile = "demo",
    target_version: int | None = None,
    promote: bool = False,
    seed: int = 0,
    backend: str | None = None,
    servers: dict | None = None,
    captured_prompts: list[CapturedPrompt] | None = None,
) -> ValidationResult:
    """Run the checklist on a drafter version; record it; with `promote`, make a passing drafter `production`.

    `backend`: "vllm" (real vLLM servers), "reference" (the CPU reference engine) or "auto"; default: the
    profile's. `servers`: the GPUs a sync's plan gives the vLLM servers (its `servers` setting). `captured_prompts`:
    held-out requests of the traffic a retrain learnt from; the drafter must clear the acceptance gate on them too.
    Long: the validation's record, promotion and artifacts follow from the one checklist run, in order."""
    from draftsync.validation.suite import run_validation_suite

    context.require_settings("validate-drafter", "registry")
    logger = context.logger()
    chosen = validation_profile(profile) if isinstance(profile, str) else profile
    registry, settings = context.registry(), context.settings()
    name = drafter_model_name(target_name)
    drafter = DrafterVersion.from_tags(name, drafter_version, registry.version_tags(name, drafter_version))
    trained_for = drafter.trained_for_version()
    against = trained_for if target_version is None else int(target_version)
    target = fetch_target(target_name, against)
    drafter_dir = fetch_drafter(target_name, drafter_version)
    # A target that declares no mix is validated on the mix its drafter was trained for.
    task_mix = target_task_mix(Path(target.path), target.tags, drafter.trained_task_mix() or EVEN_TASK_MIX).shares
    checklist = validate_drafter(
        target.path,
        drafter_dir,
        task_mix,
        chosen,
        seed=seed,
        data_check_failures=drafter.data_check_failures,
        backend=backend,
        servers=servers,
        captured_prompts=captured_prompts,
    )

    suite = run_validation_suite(
        [r for r in checklist.rows if r["phase"] == "validation"],
        {
            "min_acceptance": chosen.min_acceptance,
            "p50": chosen.min_p50,
            "p5": chosen.min_p5,
            "tasks": sorted(task_mix),
        },
    )
    reports = settings.root / "validations" / target_name / f"drafter-v{drafter_version}-target-v{against}"
    result = ValidationResult(
        checklist=checklist,
        suite=suite,
        target_name=target_name,
        target_version=against,
        drafter_name=name,
        drafter_version=int(drafter_version),
        trained_for_target_version=trained_for,
        promoted=False,
        reports_dir=str(reports),
    )
    _write_reports(result)

    failed = checklist.failed_gates
    if against == trained_for:
        record_validation(result, settings.mismatch_threshold)
    else:
        tag_drafter(
            target_name,
            drafter_version,
            {crosscheck_tag(against): "passed" if result.passed else "failed: " + ",".join(failed)},
        )
    if result.passed and promote and against == trained_for:
        result = promote_validated(result)
    elif not result.passed:
        logger.warning(
            "drafter %s v%d FAILED validation on %s v%d (gates: %s); production stays at v%s",
            name,
            drafter_version,
            target_name,
            against,
            ", ".join(failed) or "suite",
            registry.alias_version(name, "production"),
        )
    key = f"validation-{target_name}-d{drafter_version}-t{against}".lower().replace("_", "-").replace(".", "-")
    create_markdown_artifact(key=key, markdown=_markdown(result), description="drafter validation checklist")
    create_table_artifact(
        key=f"{key}-gates",
        table=[
            {"name": g.name, "value": g.reported_value, "threshold": g.threshold, "passed": g.passed}
            for g in checklist.gates
        ],
        description="validation gates",
    )
    return result
