"""The validation checklist through the real flows: a sync validates before it promotes, every gate is
reported with its value, and a drafter trained for another target fails the acceptance gates and stays put."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytestmark = pytest.mark.slow

GATES = {
    "data_coverage",
    "validation_acceptance_mean",
    "acceptance_at_deployment_temperature",
    "acceptance_p50",
    "acceptance_p5",
    "tpot_speedup",
    "stress_speedup",
    "stress_errors",
    "long_output_acceptance",
    "fallback_equivalence",
    "drafter_memory_overhead",
}


def _profile():
    from draftsync.profiles import profile

    return profile("test").model_copy(update={"train_steps": 150, "training_texts": 120, "generated_samples": 30})


def test_a_sync_validates_and_a_drafter_for_another_target_fails_and_is_not_promoted(workdir, built_targets):
    """One sync (training is the expensive part), then the pitfall: v1's drafter registered for v2."""
    from draftsync.flows.sync import sync
    from draftsync.tasks.registration import publish_target

    version = publish_target("val-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    result = sync("val-llm", version, _profile())
    _check_sync_validation(result)
    _check_mislabelled_drafter_fails(workdir, built_targets, result)


def _check_sync_validation(result: dict) -> None:
    from draftsync.tasks import context
    from draftsync.validation.checklist import gamma_knee

    validation = result["validation"]

    assert {g["name"] for g in validation["gates"]} == GATES
    for gate in validation["gates"]:
        assert set(gate) >= {"name", "value", "threshold", "passed"}
        assert gate["value"] is not None, gate  # every gate was measured, none skipped
    assert [r["gamma"] for r in validation["gamma_sweep"]] == [2, 3, 4]
    sweep = validation["gamma_sweep"]
    assert all(r["acceptance_rate_lower"] <= r["acceptance_rate"] for r in sweep)
    # The knee rule itself is tested branch by branch in tests/unit/validation/test_checklist.py; here the served
    # knee must be the one it gives for this sweep and the sync's floor (the gate, or the stale line above it).
    floor = max(_profile().validation.min_acceptance, context.settings().stale_threshold)
    sweep_knee = gamma_knee(sweep, _profile().validation.knee_tolerance, min_acceptance=floor)
    # A knee whose validation set fails an acceptance gate steps down, one swept gamma at a time.
    candidates = [sweep_knee] + sorted((r["gamma"] for r in sweep if r["gamma"] < sweep_knee), reverse=True)
    rejected = validation["gammas_rejected"]
    assert [r["gamma"] for r in rejected] == candidates[: len(rejected)]
    assert validation["gamma_knee"] == candidates[len(rejected)]
    acceptance_gates = {"validation_acceptance_mean", "acceptance_at_deployment_temperature"}
    acceptance_gates |= {"acceptance_p50", "acceptance_p5"}
    assert all(r["failed_gates"] and set(r["failed_gates"]) <= acceptance_gates for r in rejected)
    acceptance = validation["acceptance"]
    assert acceptance["p5"] <= acceptance["p50"] <= acceptance["p90"] <= acceptance["p99"]
    assert validation["passed"] == (all(g["passed"] for g in validation["gates"]) and validation["suite"]["passed"])

    # Percentiles come from per-request counts: recompute them from the per-request table.
    rows = list(__import__("csv").DictReader(open(f"{validation['reports_dir']}/requests.csv")))
    rates = [
        int(r["accepted"]) / int(r["draft_tokens"])
        for r in rows
        if r["phase"] == "validation" and int(r["draft_tokens"]) > 0
    ]
    assert acceptance["p5"] == pytest.approx(np.percentile(rates, 5), abs=1e-4)
    assert acceptance["p50"] == pytest.approx(np.percentile(rates, 50), abs=1e-4)

    registry = context.registry()
    tags = registry.version_tags("val-llm-drafter", result["drafter_version"])
    assert tags["draftsync.gamma"] == str(validation["gamma_knee"])
    assert tags["draftsync.validation.status"] == ("passed" if validation["passed"] else "failed")
    assert tags["draftsync.validation.profile"] == "test"
    assert tags["draftsync.data_checks.failed"] == "0"
    failed = [g["name"] for g in validation["gates"] if not g["passed"]]
    assert tags["draftsync.validation.failed_gates"] == (",".join(failed) or "none")
    run_id = registry.version_info("val-llm-drafter", result["drafter_version"]).run_id
    reports = {a.path for a in registry._client.list_artifacts(run_id, "reports")}
    assert {
        "reports/acceptance_vs_gamma.png",
        "reports/acceptance_by_position.png",
        "reports/validation.json",
        "reports/requests.csv",
    } <= reports
    sweep = registry._client.get_metric_history(run_id, "sweep.tpot_ms")
    assert sorted(m.step for m in sweep) == [2, 3, 4]
    production = registry.alias_version("val-llm-drafter", "production")
    assert (production == result["drafter_version"]) == validation["passed"]


def _check_mislabelled_drafter_fails(workdir, built_targets, first: dict) -> None:
    """The pitfall: the target was fine-tuned (v2) and the v1 drafter registered for it without retraining."""
    from pathlib import Path

    from draftsync.flows.validate import validate
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    registry = context.registry()
    production_before = registry.alias_version("val-llm-drafter", "production")
    v2 = publish_target("val-llm", str(built_targets[2]), {"code": 0.25, "math": 0.25, "prose": 0.5})
    stale_dir = Path(registry.download("val-llm-drafter", first["drafter_version"]))
    mislabelled = registry.register_drafter("val-llm", v2, stale_dir, "eagle3", 2, {}, validation_passed=None)

    result = validate("val-llm", mislabelled, "test", promote=True)

    failed = set(result.checklist.failed_gates)
    assert {"validation_acceptance_mean", "acceptance_p50"} <= failed, result.checklist.gates
    assert not result.passed and not result.promoted
    assert registry.alias_version("val-llm-drafter", "production") == production_before
    tags = registry.version_tags("val-llm-drafter", mislabelled)
    assert tags["draftsync.validation.status"] == "failed"
    assert "validation_acceptance_mean" in tags["draftsync.validation.failed_gates"].split(",")
    with pytest.raises(Exception, match="has not passed validation"):
        registry.promote("val-llm", mislabelled)

    # The same check from the command line: every gate listed with its value, exit code 1 on failure.
    from draftsync.cli.app import app
    from typer.testing import CliRunner

    out = Path(workdir).parent / "validate.json"
    cli = CliRunner().invoke(
        app,
        ["--workdir", str(workdir), "validate", "val-llm", str(mislabelled), "--profile", "test", "--json", str(out)],
    )
    assert cli.exit_code == 1, cli.output[-3000:]
    data = json.loads(out.read_text())
    assert {g["name"] for g in data["gates"]} == GATES
    assert set(data) >= {"gates", "gamma_sweep", "gamma_knee", "acceptance", "tpot_ms", "speedup", "profile", "passed"}
    assert data["profile"] == "test" and data["passed"] is False
    assert "FAIL" in cli.stdout and "validation_acceptance_mean" in cli.stdout
