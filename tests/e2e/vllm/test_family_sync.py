"""Each built-in target family end to end, as a user brings a checkpoint: `draftsync targets register`, the whole
sync (dataset shards, data checks, EAGLE-3 training, registration with the family in the tags, the checklist), and
the pair rolled out on real vLLM, answering with speculation.

The checklist's thresholds are opened here: the subject is that every family goes through every stage and serves;
whether a tiny target's briefly trained drafter is good enough is not (tests/e2e/vllm/test_target_families.py holds
vLLM's acceptance to the reference engine's per family and method; test_moe_families.py the MoE families' EAGLE-3).
About 2.5 min a dense family on 2 cores.
"""

from __future__ import annotations

import pytest

from tests.e2e.vllm.test_moe_families import MOE_TARGET_FAMILIES
from tests.e2e.vllm.test_target_families import TARGET_FAMILIES, family_target

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.parametrize("family", TARGET_FAMILIES + MOE_TARGET_FAMILIES)
def test_a_registered_family_checkpoint_syncs_and_serves_with_speculation_on_vllm(
    family, workdir, vllm_engine, tmp_path
):
    import httpx
    from draftsync.cli.app import app
    from draftsync.flows.rollout import rollout
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile, validation_profile
    from draftsync.registry.tags import TargetVersion
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.speculative.data.corpora import prompts
    from draftsync.tasks import context
    from draftsync.tasks.traffic import spec_decode_counts
    from typer.testing import CliRunner

    name = f"{family}-llm"
    target_dir = family_target(family, tmp_path)
    registered = CliRunner().invoke(
        app,
        ["--workdir", str(workdir), "targets", "register", str(target_dir), "--name", name]
        + ["--task-mix", "code=0.5,math=0.5", "--no-sync"],
    )
    assert registered.exit_code == 0, registered.output
    registry = context.registry()
    target = TargetVersion.from_tags(name, 1, registry.version_tags(name, 1))
    assert target.family == ("llama" if family == "llama3" else family)

    opened = validation_profile("test").model_copy(
        update={
            "min_acceptance": 0.0,
            "min_p50": 0.0,
            "min_p5": 0.0,
            "min_speedup": 0.0,
            "min_long_acceptance": 0.0,
            "stress_requests": 2,
        }
    )
    small = profile("test").model_copy(
        update={"train_steps": 150, "training_texts": 160, "generated_samples": 32, "validation": opened}
    )
    result = sync(name, 1, small)
    assert result["data_checks"]["passed"] and result["dataset"]["sequences"] > 0
    assert result["method"] == "eagle3" and result["passed"], result["validation"]

    deployment = ServingDeployment(name=f"{family}-serving", target_name=name, launch="vllm", temperature=0.0)
    served = rollout(deployment)
    pair = context.store().pairs.get(deployment.name)
    assert (pair.state, pair.target_version, pair.drafter_version) == ("serving", 1, result["drafter_version"])
    assert served["state"] == "serving" and served["drafter_version"] == result["drafter_version"], served

    draft_tokens = accepted = 0
    with httpx.Client(base_url=pair.endpoint, timeout=120) as client:
        for prompt in prompts("code", 3, seed=7):
            answer = client.post(
                "/v1/completions",
                json={"model": deployment.name, "prompt": prompt, "max_tokens": 32, "temperature": 0},
            )
            assert answer.status_code == 200, answer.text
            counts = spec_decode_counts(answer.json())
            draft_tokens += counts["draft_tokens"]
            accepted += counts["accepted"]
    assert draft_tokens > 0 and accepted > 0, (family, draft_tokens, accepted)
