"""A sync of the demo target with the demo profile whose hidden states vLLM's CPU build took, beside the same sync with
the target's own forward passes: both drafters pass the same gates, with the same acceptance within 0.05.

About 4 min on 2 cores: two demo syncs, one vLLM start for the states.
"""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


@pytest.mark.timeout(2400)  # two demo syncs: 7 min on a quiet machine, far more beside another test run
def test_a_demo_sync_with_hidden_states_from_vllm_passes_the_gates_the_transformers_sync_passes(
    workdir, vllm_engine, tmp_path
):
    import shutil

    from draftsync.cli.app import app
    from draftsync.flows.sync import sync
    from draftsync.profiles import profile
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from typer.testing import CliRunner

    built = build_target(builtin_recipe(1, "demo"), tmp_path / "cache")
    results = {}
    for engine in ("transformers", "vllm"):  # a target name each: the ledger syncs a version once
        name = f"demo-{engine}"
        registered = CliRunner().invoke(
            app,
            ["--workdir", str(workdir), "targets", "register", str(shutil.copytree(built, tmp_path / name))]
            + ["--name", name, "--task-mix", "code=0.5,math=0.5", "--no-sync"],
        )
        assert registered.exit_code == 0, registered.output
        result = sync(name, 1, profile("demo").model_copy(update={"hidden_states_engine": engine}))
        assert result["dataset"]["states_engine"] == engine, result["dataset"]  # what took every shard's states
        results[engine] = result
    gates = {
        engine: {gate["name"]: (gate["value"], gate["passed"]) for gate in result["validation"]["gates"]}
        for engine, result in results.items()
    }
    print(json.dumps(gates, indent=1))
    for engine, result in results.items():
        assert result["passed"], (engine, result["validation"])
    assert set(gates["vllm"]) == set(gates["transformers"])
    accepted = {engine: gates[engine]["validation_acceptance_mean"][0] for engine in gates}
    assert abs(accepted["vllm"] - accepted["transformers"]) < 0.05, accepted
