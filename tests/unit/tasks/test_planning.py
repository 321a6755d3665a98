"""The sync's plan: the decision framework fed by the target's tags and the deployment that serves it."""

from __future__ import annotations

import json

import pytest
from draftsync.profiles import profile

TAGS_70B_CODE = {
    "draftsync.num_parameters": str(70_000_000_000),
    "draftsync.task_mix": json.dumps({"code": 0.8, "math": 0.2}),
}


@pytest.fixture()
def planning_workdir(tmp_path, monkeypatch):
    from draftsync.tasks import context

    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path / "work"))
    context.reset()
    yield tmp_path / "work"
    context.reset()


def write_deployment(workdir, **fields) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"    {key}: {value}\n" for key, value in fields.items())
    (workdir / "deployments.yaml").write_text(f"deployments:\n  - name: code-chat\n    target_name: big-llm\n{lines}")


def test_a_production_profile_follows_the_recommendation_for_its_hardware(planning_workdir):
    from draftsync.tasks.planning import plan_drafter, recommendation_tags

    write_deployment(planning_workdir, tensor_parallel_size=4, gpu_memory_gb=80, tpot_target_ms=25)
    plan = plan_drafter.fn("big-llm", TAGS_70B_CODE, profile("production"))
    assert plan.advice.applied and plan.advice.assumptions == ("ttt_steps raised from 4 to the recommended gamma 6",)
    chosen = plan.profile
    assert (chosen.method, chosen.gamma, chosen.validation.gamma_range) == ("eagle3.1", 6, (6, 8))
    # the drafter learns as many positions ahead as it will draft, not the profile's 4
    assert profile("production").ttt_steps == 4 and chosen.ttt_steps == 6
    tags = recommendation_tags(plan.advice)
    assert json.loads(tags["draftsync.recommended.gamma_range"]) == [6, 8]
    assert tags["draftsync.recommended.gamma_start"] == "6" and tags["draftsync.recommended.applied"] == "true"
    assert "[latency:interactive]" in tags["draftsync.recommended.reasons"]


def test_the_demo_profile_records_the_recommendation_without_following_it(planning_workdir):
    from draftsync.tasks.planning import plan_drafter

    tiny = {"draftsync.num_parameters": "1800000", "draftsync.task_mix": json.dumps({"code": 0.5, "prose": 0.5})}
    demo = profile("demo")
    plan = plan_drafter.fn("tiny-llm", tiny, demo)
    assert plan.advice.recommendation.method == "none"  # a 1.8M-parameter target: the framework says no drafter
    assert not plan.advice.applied and plan.profile == demo
    assert any("no deployment serves tiny-llm" in a for a in plan.advice.assumptions)


def test_advice_not_to_speculate_is_said_and_the_profile_method_is_trained(planning_workdir):
    from draftsync.tasks.planning import plan_drafter

    write_deployment(planning_workdir, tpot_target_ms=40)  # 1 x 80 GB, 1.8M parameters -> none
    plan = plan_drafter.fn(
        "big-llm", {"draftsync.num_parameters": "1800000", "draftsync.task_mix": "{}"}, profile("production")
    )
    assert plan.advice.recommendation.method == "none"
    assert not plan.advice.applied and plan.profile.method == "eagle3"
    assert any(
        "advises no speculative decoding for big-llm" in a and "trained and validated anyway" in a
        for a in plan.advice.assumptions
    )
    assert not any("not one a sync trains" in a for a in plan.advice.assumptions)


def test_a_recommended_medusa_is_trained_with_a_head_per_drafted_token(planning_workdir):
    """Step 2's Medusa option: 8 GPUs, a target over 70B, chat traffic (nothing asks for EAGLE 3.1)."""
    from draftsync.tasks.planning import plan_drafter

    write_deployment(planning_workdir, tensor_parallel_size=8, gpu_memory_gb=80, tpot_target_ms=40)
    tags = {"draftsync.num_parameters": str(120 * 10**9), "draftsync.task_mix": json.dumps({"prose": 1.0})}
    plan = plan_drafter.fn("big-llm", tags, profile("production"))
    assert plan.advice.recommendation.method == "medusa", plan.advice.recommendation.reasons
    chosen = plan.profile
    assert plan.advice.applied and chosen.method == "medusa"
    assert chosen.medusa_heads == max(profile("production").medusa_heads, plan.advice.recommendation.gamma_start)
