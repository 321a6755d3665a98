"""The pair rule: a target version without a validated drafter is served with speculation off."""

from __future__ import annotations

import httpx


def test_a_target_without_a_validated_drafter_is_served_plain(workdir, built_targets, tmp_path):
    from draftsync.flows.rollout import rollout
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context
    from draftsync.tasks.registration import publish_target
    from tests.serving.tiny_models import build_tiny_drafter

    registry = context.registry()
    v1 = publish_target("pair-llm", str(built_targets[1]), {"code": 0.5, "math": 0.5})
    # A drafter exists for v1, but it failed validation: it must not serve.
    drafter_dir = build_tiny_drafter(built_targets[1], tmp_path / "drafter", gamma=2)
    registry.register_drafter("pair-llm", v1, drafter_dir, "eagle3", 2, {"acceptance_rate": 0.2}, validation_passed=False)

    result = rollout(ServingDeployment(name="pair", target_name="pair-llm"))

    assert result["state"] == "fallback"
    assert result["drafter_version"] is None
    assert result["vllm"]["speculative_config"] is None
    assert "--speculative-config" not in result["vllm"]["argv"]
    pair = context.store().serving_pair("pair")
    assert (pair.state, pair.target_version, pair.drafter_version) == ("fallback", v1, None)
    metrics = httpx.get(f"{result['endpoint']}/metrics", timeout=10).text
    assert "vllm:spec_decode_num_drafts" not in metrics
    completion = httpx.post(
        f"{result['endpoint']}/v1/completions", json={"model": "pair", "prompt": "def f(x):\n", "max_tokens": 4, "temperature": 0},
        timeout=60,
    ).json()
    assert 1 <= completion["usage"]["completion_tokens"] <= 4
    assert completion["draftsync"]["draft_tokens"] == 0
