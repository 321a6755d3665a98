"""Llama-3.1-70B on 8 x 80 GB: every stage on the whole node (the servers as data-parallel replicas, the hidden states
from vLLM's extract_hidden_states where the worker's vLLM has it), and each engine setting the worker cannot honour
refused before any server starts."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.support.published_targets import save_published_configs

ALL = list(range(8))


@pytest.fixture(scope="module")
def seventy(tmp_path_factory):
    return save_published_configs(tmp_path_factory.mktemp("published")) / "llama-3.1-70b"


def _plan(directory, out, vllm: str) -> tuple[dict, str]:
    from draftsync.cli.app import app

    argv = ["plan", str(directory), "--profile", "production", "--gpus", "8", "--gpu-memory-gb", "80"]
    argv += ["--host-memory-gb", "512", "--disk-gb", "8000", "--vllm-version", vllm, "--json", str(out)]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text()), result.output


def _table(plan: dict) -> dict[str, tuple[list[int], float]]:
    return {
        s["stage"]: (sorted({g for o in s["occupants"] for g in o["gpus"]}), round(s["hours_estimate"], 2))
        for s in plan["stages"]
    }


def test_70b_on_eight_80gb_gpus_uses_every_gpu_in_every_stage(seventy, tmp_path):
    """Before: responses and validation on GPUs 0-1 (0.82 h, 12 h), hidden states through a device_map over 0-1.
    After: the 2,642 responses on four TP-2 replicas, the states on two TP-4 replicas (131,072-token context)."""
    without, _ = _plan(seventy, tmp_path / "none.json", "none")
    with_vllm, output = _plan(seventy, tmp_path / "vllm.json", "0.32.0")
    assert _table(without) == {
        "responses": (ALL, 0.1),  # 2,705,408 tokens x 141 GB / (2.01 TB/s x TP 2 x 4 replicas x 64)
        "hidden_states": ([0, 1], 2.82),  # 4.02e18 FLOPs at 396 TFLOP/s, one GPU of the device_map at a time
        "training": (ALL, 2.42),
        "validation": (ALL, 2.78),
    }
    assert _table(with_vllm) == {**_table(without), "hidden_states": (ALL, 0.35)}  # eight GPUs prefilling
    assert without["settings"]["hidden_states_engine"] == "transformers"
    assert with_vllm["settings"]["hidden_states_engine"] == "vllm"
    states = with_vllm["settings"]["hidden_states_server"]
    assert (states["tensor_parallel_size"], states["data_parallel_size"], states["max_model_len"]) == (4, 2, 131072)
    assert with_vllm["settings"]["hidden_states_layer_ids"] == [2, 40, 77, 80]  # aux depths and the last layer
    servers = with_vllm["settings"]["servers"]
    assert (servers["tensor_parallel_size"], servers["data_parallel_size"], servers["devices"]) == (2, 4, ALL)
    assert with_vllm["settings"]["servers"]["data_parallel_size"] == 4  # the validation's requests 4 at a time
    # the validation cannot meet the hour here, and says why, with the figures to check it
    validation = with_vllm["reasons"]["validation"]
    assert "2.8 h; over the 1 h goal" in validation and "about 307,681 steps" in validation
    assert "1,036,720 decoding steps" in output and "a step 35.1 ms" in output and "5 server start(s)" in output
    assert "2,705,408 tokens (2,642 x 1024)" in output and "4.02e+18 FLOPs on 8 GPU(s)" in output
    assert "--data-parallel-size 4" in with_vllm["commands"]["vllm_server"]


def test_the_hidden_states_engine_is_vllm_where_the_worker_has_one_with_extract_hidden_states(seventy):
    from draftsync.planning.sync_plan import plan_sync
    from draftsync.planning.target_shape import TargetShape
    from draftsync.planning.worker import Worker
    from draftsync.profiles import profile

    target, production = TargetShape.from_directory(seventy), profile("production")

    def engine(version, gpus=8, **changes) -> tuple[str, str]:
        plan = plan_sync(
            target, Worker(gpus, 80, 512, 8000, vllm_version=version), production.model_copy(update=changes), 1000
        )
        assert plan.fits, plan.refusal
        return plan.settings["hidden_states_engine"], plan.reasons["hidden_states_engine"]

    assert engine("0.32.0")[0] == "vllm" and "extract_hidden_states since 0.18.0" in engine("0.32.0")[1]
    assert engine("0.18.0rc1")[0] == "vllm"
    assert engine(None) == ("transformers", "transformers: this worker has no vLLM")
    assert engine("0.17.1")[1] == (
        "transformers: vLLM 0.17.1 has no extract_hidden_states speculative method (vLLM has it since 0.18.0)"
    )
    assert engine("0.32.0", hidden_states_engine="transformers")[0] == "transformers"
    assert engine("0.32.0", hidden_states="online")[1].startswith("transformers: online states are computed")
    online = engine("0.32.0", hidden_states="online", hidden_states_engine="vllm")  # the trainer asks a live server
    assert online[0] == "vllm" and "online: the trainer asks one vLLM server" in online[1]
    # a CPU worker keeps transformers unless the profile asks
    small = TargetShape.from_directory(seventy.parent / "gpt-oss-20b")
    on_cpu = plan_sync(small, Worker(0, 0, 512, 8000, vllm_version="0.32.0"), production, 10)
    assert on_cpu.settings["hidden_states_engine"] == "transformers"
    assert "auto takes vLLM on GPU workers only" in on_cpu.reasons["hidden_states_engine"]


@pytest.mark.parametrize(
    ("version", "changes", "needed", "available", "fix"),
    [
        (
            None,
            {"hidden_states_engine": "vllm"},
            "a vLLM with the extract_hidden_states",
            "no vLLM",
            "install vLLM >= 0.18.0",
        ),
        ("0.17.1", {"hidden_states_engine": "vllm"}, "vLLM >= 0.18.0", "vLLM 0.17.1", "upgrade vLLM on the worker"),
        ("latest", {}, "a vLLM release number", "vLLM version 'latest'", "--vllm-version 0.32.0"),
        (
            None,
            {"hidden_states_engine": "vllm", "hidden_states": "online"},
            "to answer each batch's states online",
            "no vLLM",
            "install vLLM >= 0.18.0",
        ),
    ],
)
def test_an_engine_the_worker_cannot_give_is_refused_naming_it_and_the_fix(
    seventy, version, changes, needed, available, fix
):
    from draftsync.planning.sync_plan import plan_sync
    from draftsync.planning.target_shape import TargetShape
    from draftsync.planning.worker import Worker
    from draftsync.profiles import profile

    asked = profile("production").model_copy(update=changes)
    plan = plan_sync(TargetShape.from_directory(seventy), Worker(8, 80, 512, 8000, vllm_version=version), asked, 1000)
    assert plan.refusal is not None and plan.refusal.stage == "hidden_states"
    assert needed in plan.refusal.needed and plan.refusal.available.startswith(available) and fix in plan.refusal.fix
    with pytest.raises(Exception, match="no dataset was written and no training started"):
        plan.require_fit()


def test_aux_layer_ids_the_target_does_not_have_are_refused_before_any_server_starts(seventy):
    from draftsync.errors import DraftsyncError
    from draftsync.planning.sync_plan import plan_sync
    from draftsync.planning.target_shape import TargetShape
    from draftsync.planning.worker import Worker
    from draftsync.profiles import with_changes

    target = TargetShape.from_directory(seventy)
    worker = Worker(8, 80, 512, 8000, vllm_version="0.32.0")
    beyond = with_changes(profile_named("production"), "a test", aux_layer_ids=(2, 40, 81))
    with pytest.raises(DraftsyncError) as refused:
        plan_sync(target, worker, beyond, 1000)
    assert "aux_layer_ids [2, 40, 81] are not distinct layers" in refused.value.what
    assert "in 0..80" in refused.value.fix and "[2, 40, 77] here" in refused.value.fix
    chosen = with_changes(profile_named("production"), "a test", aux_layer_ids=(0, 40, 80))
    # the last layer is an aux depth too: vLLM caches each layer once
    assert plan_sync(target, worker, chosen, 1000).settings["hidden_states_layer_ids"] == [0, 40, 80]


def profile_named(name: str):
    from draftsync.profiles import profile

    return profile(name)
