"""A target that ships its own MTP head, synced and rolled out on vLLM's CPU build: target v1 registered as a user
brings it (`draftsync targets register`), its head measured on vLLM and served as shipped; the fine-tuned v2, whose
head the fine-tune left as it was, measured stale, the head refreshed on v2's own answers, validated against the
shipped one, registered with its lineage, promoted and rolled out with vLLM's method mtp, answering with speculation.

The acceptance gate (0.6) sits under v1's head and the refreshed one (0.85 and 0.91 on this validation set, vLLM CPU)
and about at v2's stale head (0.59), which is stale either way: it scores under the pair serving v1. The speed gates
are opened, as a tiny target on 2 cores breaks even at best. About 10 min on 2 cores.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

MIX = "code=0.4,math=0.3,prose=0.3"


def _register(workdir, target_dir) -> None:
    from draftsync.cli.app import app
    from typer.testing import CliRunner

    registered = CliRunner().invoke(
        app,
        ["--workdir", str(workdir), "targets", "register", str(target_dir), "--name", "mimo-llm"]
        + ["--task-mix", MIX, "--no-sync"],
    )
    assert registered.exit_code == 0, registered.output


def _served_with_speculation(endpoint: str, model: str) -> tuple[int, int]:
    import httpx
    from draftsync.speculative.data.corpora import prompts
    from draftsync.tasks.traffic import spec_decode_counts

    drafted = accepted = 0
    with httpx.Client(base_url=endpoint, timeout=120) as client:
        for prompt in prompts("code", 3, seed=7):
            answer = client.post(
                "/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 32, "temperature": 0}
            )
            assert answer.status_code == 200, answer.text
            counts = spec_decode_counts(answer.json())
            drafted, accepted = drafted + counts["draft_tokens"], accepted + counts["accepted"]
    return drafted, accepted


def test_a_stale_mtp_head_is_measured_refreshed_registered_and_rolled_out_on_vllm(
    workdir, vllm_engine, built_mimo_targets
):
    from draftsync.flows.rollout import rollout
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile, validation_profile
    from draftsync.registry.tags import TargetVersion
    from draftsync.serving.deployment import ServingDeployment
    from draftsync.tasks import context

    registry = context.registry()
    gated = validation_profile("test").model_copy(
        update={
            "backend": "vllm",
            "gamma_range": (1, 3),
            "min_acceptance": 0.6,
            "min_p50": 0.5,
            "min_p5": 0.0,
            "min_speedup": 0.0,
            "min_long_acceptance": 0.0,
            "stress_requests": 2,
        }
    )
    small = profile("test").model_copy(update={"generated_samples": 96, "warm_start_steps": 150, "validation": gated})
    deployment = ServingDeployment(name="mimo-serving", target_name="mimo-llm", launch="vllm", temperature=0.0)

    _register(workdir, built_mimo_targets[1])
    assert TargetVersion.from_tags("mimo-llm", 1, registry.version_tags("mimo-llm", 1)).mtp_head() == "mimo"
    first = sync("mimo-llm", 1, small)
    assert first["method"] == "mtp" and first["mtp_head"]["promoted"] == "shipped", first["mtp_head"]
    assert first["validation"]["backend"] == "vllm"
    served = rollout(deployment)
    assert (served["state"], served["drafter_version"]) == ("serving", first["drafter_version"]), served

    _register(workdir, built_mimo_targets[2])
    second = sync("mimo-llm", 2, small)
    head = second["mtp_head"]
    print(first["mtp_head"], head, second["stages_s"])
    assert head["served_before"] == pytest.approx(first["mtp_head"]["shipped_acceptance"])
    assert head["shipped_acceptance"] < head["served_before"], "the fine-tune left v2's head as good as v1's"
    assert head["promoted"] == "refreshed" and head["refreshed_acceptance"] > head["shipped_acceptance"], head
    tags = registry.version_tags("mimo-llm-drafter", head["refreshed_version"])
    assert (tags["draftsync.mtp_head"], tags["draftsync.mtp_head.refreshed_from"]) == (
        "refreshed",
        str(head["shipped_version"]),
    )
    assert tags["draftsync.target.version"] == "2" and tags["draftsync.method"] == "mtp"

    served = rollout(deployment)
    pair = context.store().pairs.get(deployment.name)
    assert (pair.state, pair.target_version, pair.drafter_version) == ("serving", 2, head["refreshed_version"]), served
    drafted, accepted = _served_with_speculation(pair.endpoint, deployment.name)
    assert drafted > 0 and accepted > 0, (drafted, accepted)
