"""The rollout serves the draft sampling validation measured better, unless the deployment sets its own."""

from __future__ import annotations

from draftsync.flows.rollout import served_draft_sampling
from draftsync.registry.tags import DRAFT_SAMPLING_TAG, DrafterVersion
from draftsync.serving.deployment import ServingDeployment


def drafter(tags: dict[str, str]) -> DrafterVersion:
    return DrafterVersion.from_tags("llm-drafter", 3, tags)


def deployment(**fields) -> ServingDeployment:
    return ServingDeployment(name="chat", target_name="llm", temperature=1.0, **fields)


def test_validations_choice_serves_where_the_deployment_sets_none():
    sampling, why = served_draft_sampling(deployment(), drafter({DRAFT_SAMPLING_TAG: "probabilistic"}))
    assert sampling == "probabilistic" and "validation measured it better" in why


def test_the_deployments_explicit_choice_wins_and_the_rollout_says_so():
    sampling, why = served_draft_sampling(
        deployment(draft_sampling="greedy"), drafter({DRAFT_SAMPLING_TAG: "probabilistic"})
    )
    assert sampling == "greedy"
    assert why == "greedy: the deployment sets it; validation measured probabilistic better"
    assert served_draft_sampling(deployment(draft_sampling="greedy"), drafter({}))[1] == (
        "greedy: the deployment sets it"
    )


def test_nothing_chosen_keeps_vllms_default():
    sampling, why = served_draft_sampling(deployment(), drafter({}))
    assert sampling is None and "vLLM's default" in why
