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
    chat = {**TAGS_70B_CODE, "draftsync.task_mix": json.dumps({"prose": 1.0})}
    plan = plan_drafter.fn("big-llm", chat, profile("production"))
    assert plan.advice.applied and plan.advice.assumptions == ("ttt_steps raised from 4 to the recommended gamma 5",)
    chosen = plan.profile
    assert (chosen.method, chosen.gamma, chosen.validation.gamma_range) == ("eagle3.1", 5, (5, 5))
    # the drafter learns as many positions ahead as it will draft, not the profile's 4
    assert profile("production").ttt_steps == 4 and chosen.ttt_steps == 5
    tags = recommendation_tags(plan.advice)
    assert json.loads(tags["draftsync.recommended.gamma_range"]) == [5, 5]
    assert tags["draftsync.recommended.gamma_start"] == "5" and tags["draftsync.recommended.applied"] == "true"
    assert "[latency:interactive]" in tags["draftsync.recommended.reasons"]
    assert "[block:low-gamma]" in tags["draftsync.recommended.reasons"]


def test_a_followed_block_drafter_gets_a_block_that_holds_its_gamma_and_says_the_batch_it_assumed(planning_workdir):
    """Code at TPOT 25 ms on 70B: the block rule's DFlash at the batch of 1 a deployment's silence leaves; a profile's
    block too small for the recommended gamma is raised (the committed token and 6 drafted)."""
    from draftsync.profiles import SyncProfile
    from draftsync.tasks.planning import plan_drafter, recommendation_tags

    write_deployment(planning_workdir, tensor_parallel_size=4, gpu_memory_gb=80, tpot_target_ms=25)
    plan = plan_drafter.fn("big-llm", TAGS_70B_CODE, profile("production"))
    chosen = plan.profile
    assert plan.advice.applied and (chosen.method, chosen.gamma, chosen.validation.gamma_range) == ("dflash", 6, (6, 8))
    assert chosen.block_size == 8 and chosen.ttt_steps == profile("production").ttt_steps  # 8 holds 6 after one
    (assumed,) = plan.advice.assumptions
    assert "batch 1 assumed" in assumed and "keeps eagle3.1" in assumed
    assert assumed in recommendation_tags(plan.advice)["draftsync.recommended.reasons"]
    small_block = profile("production").model_copy(update={"block_size": 4})
    raised = plan_drafter.fn("big-llm", TAGS_70B_CODE, small_block)
    assert raised.profile.block_size == 7 and any(
        "block_size raised from 4 to 7" in a for a in raised.advice.assumptions
    )
    SyncProfile.model_validate(raised.profile.model_dump())  # a profile the sync can run


def test_a_followed_peagle_learns_as_many_depths_as_its_recommended_gamma(planning_workdir):
    """Over 70B the block rule takes P-EAGLE (EAGLE-3's drafter cost); its max_draft_tokens covers the gamma start."""
    from draftsync.profiles import SyncProfile
    from draftsync.tasks.planning import plan_drafter

    write_deployment(planning_workdir, tensor_parallel_size=4, gpu_memory_gb=80, tpot_target_ms=25)
    tags = {**TAGS_70B_CODE, "draftsync.num_parameters": str(120 * 10**9)}
    plan = plan_drafter.fn("big-llm", tags, profile("production"))
    assert plan.advice.applied and (plan.profile.method, plan.profile.gamma) == ("peagle", 6)
    assert plan.profile.max_draft_tokens == 6 and not any("raised" in a for a in plan.advice.assumptions)
    fewer = plan_drafter.fn("big-llm", tags, profile("production").model_copy(update={"max_draft_tokens": 4}))
    assert fewer.profile.max_draft_tokens == 6
    assert "max_draft_tokens raised from 4 to 6: the recommended gamma 6" in fewer.advice.assumptions
    SyncProfile.model_validate(fewer.profile.model_dump())


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
