"""A target that ships its own MTP head, synced through the real flow on the reference engine: v1's head is measured
and serves as shipped; v2 (fine-tuned, its head left as it was) is measured under the pair serving, refreshed on
v2's own answers, validated against the shipped head and promoted, each head registered with its lineage."""

from __future__ import annotations

import pytest

MIX = {"code": 0.4, "math": 0.3, "prose": 0.3}


@pytest.mark.system
def test_a_stale_shipped_head_is_refreshed_validated_registered_and_promoted(workdir, built_mimo_targets):
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile, validation_profile
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    checklist = validation_profile("test").model_copy(
        # the subject is the flow: speed gates opened (2 busy cores time noisily), acceptance decides staleness
        update={"min_acceptance": 0.3, "min_p50": 0.3, "min_p5": 0.0, "min_speedup": 0.0, "gamma_range": (1, 3)}
    )
    small = profile("test").model_copy(
        update={"generated_samples": 96, "warm_start_steps": 150, "validation": checklist}
    )
    registry = context.registry()

    v1 = publish_target("mimo-llm", str(built_mimo_targets[1]), MIX)
    first = sync("mimo-llm", v1, small)
    assert first["method"] == "mtp" and first["passed"], first["mtp_head"]
    assert first["training"] is None and first["dataset"] is None and first["data_checks"] is None
    assert first["mtp_head"]["promoted"] == "shipped" and first["mtp_head"]["served_before"] is None
    tags = registry.version_tags("mimo-llm-drafter", first["drafter_version"])
    assert tags["draftsync.method"] == "mtp" and tags["draftsync.mtp_head"] == "shipped"
    assert tags["draftsync.target.version"] == str(v1)
    assert registry.alias_version("mimo-llm-drafter", "production") == first["drafter_version"]

    v2 = publish_target("mimo-llm", str(built_mimo_targets[2]), MIX)
    second = sync("mimo-llm", v2, small)
    head = second["mtp_head"]
    assert head["served_before"] == pytest.approx(first["mtp_head"]["shipped_acceptance"])
    assert head["shipped_acceptance"] < head["served_before"], "the fine-tune left v2's head as good as v1's"
    assert head["promoted"] == "refreshed" and head["refreshed_acceptance"] > head["shipped_acceptance"], head
    assert second["drafter_version"] == head["refreshed_version"] and second["passed"]
    assert second["training"]["steps"] == 150 and second["training"]["final_loss"] < second["training"]["first_loss"]
    assert registry.alias_version("mimo-llm-drafter", "production") == head["refreshed_version"]
    refreshed = registry.version_tags("mimo-llm-drafter", head["refreshed_version"])
    assert refreshed["draftsync.mtp_head"] == "refreshed"
    assert refreshed["draftsync.mtp_head.refreshed_from"] == str(head["shipped_version"])
    shipped = registry.version_tags("mimo-llm-drafter", head["shipped_version"])
    assert shipped["draftsync.mtp_head.verdict"].startswith("not promoted: ")  # failed a gate, or under v1
    print(first["mtp_head"], head, second["stages_s"])

    from draftsync.cli.app import app
    from typer.testing import CliRunner

    shown = CliRunner().invoke(app, ["status"], env={"COLUMNS": "240"})
    assert shown.exit_code == 0, shown.output
    assert f"v{v1} ships a mimo MTP head; v{v2} ships a mimo MTP head" in " ".join(shown.output.split())
    assert f"v{head['refreshed_version']} <- t{v2} mtp (refreshed head) passed [production]" in shown.output
    assert f"v{head['shipped_version']} <- t{v2} mtp (shipped head) " in shown.output


@pytest.mark.system
def test_a_refreshed_head_under_the_shipped_one_is_not_promoted_and_the_sync_says_why(workdir, built_mimo_targets):
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile, validation_profile
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target

    # a gate the stale head fails, and a refresh of one step at a rate that cannot move it
    checklist = validation_profile("test").model_copy(update={"min_acceptance": 0.75, "gamma_range": (1, 2)})
    idle = profile("test").model_copy(
        update={"generated_samples": 16, "warm_start_steps": 1, "lr": 1e-9, "validation": checklist}
    )
    version = publish_target("stale-llm", str(built_mimo_targets[2]), MIX)
    result = sync("stale-llm", version, idle)
    head = result["mtp_head"]
    assert not head["shipped_passed"] and head["refreshed_version"] is not None, head
    assert head["promoted"] is None and not result["passed"]
    assert "a refreshed head under the shipped one is not promoted" in head["reason"], head["reason"]
    registry = context.registry()
    assert registry.alias_version("stale-llm-drafter", "production") is None  # nothing serves
    tags = registry.version_tags("stale-llm-drafter", head["refreshed_version"])
    assert (
        "a refreshed head under the shipped one is not promoted: it failed its gates"
        in tags["draftsync.mtp_head.verdict"]
    )
