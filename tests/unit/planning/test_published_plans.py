"""`draftsync plan` on config-only checkpoints of targets teams serve, mixture-of-experts and quantized, on one, two
and eight 80 GB GPUs: each planned from its own description, or refused as its sync would refuse it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.support.published_targets import save_published_configs

# Per target, the verdict on 1, 2 and 8 x 80 GB: "fits", or the stage that refuses it.
VERDICTS = {
    "qwen3-30b-a3b": ("fits", "fits", "fits"),  # 56.9 GiB of bf16 weights fit one GPU
    "mixtral-8x7b": ("hidden_states", "fits", "fits"),  # 87 GiB: a device_map over two
    "llama-3.1-70b-fp8": ("validation", "fits", "fits"),  # 67.7 GiB of fp8 weights and a server's KV cache
    "llama-3.1-70b": ("hidden_states", "fits", "fits"),  # 131.4 GiB of bf16 weights: a device_map over two
    "gpt-oss-20b": ("fits", "fits", "fits"),  # 12.8 GiB of mxfp4 experts (about 39 GiB dequantized) fit one GPU
    "deepseek-v3": ("target", "target", "target"),
}


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    return save_published_configs(tmp_path_factory.mktemp("published"))


@pytest.fixture(scope="module")
def shapes(published):
    from draftsync.planning.target_shape import TargetShape

    return {name: TargetShape.from_directory(published / name, name) for name in VERDICTS}


def _plan(directory, gpus: int, out) -> tuple[int, dict, str]:
    from draftsync.cli.app import app

    argv = ["plan", str(directory), "--profile", "production", "--gpus", str(gpus), "--gpu-memory-gb", "80"]
    argv += ["--host-memory-gb", "512", "--disk-gb", "8000", "--json", str(out)]
    result = CliRunner().invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(out.read_text()), result.output


@pytest.mark.parametrize("name", sorted(VERDICTS))
def test_a_published_target_is_planned_on_one_two_and_eight_gpus(shapes, name):
    from draftsync.planning.sync_plan import plan_sync
    from draftsync.planning.worker import Worker
    from draftsync.profiles import profile

    verdicts = []
    for gpus in (1, 2, 8):
        plan = plan_sync(shapes[name], Worker(gpus, 80, 512, 8000), profile("production"))
        facts = plan.to_dict()["target_facts"]
        assert plan.parameters == facts["parameters"] and facts["active_parameters"] <= facts["parameters"]
        assert f"{facts['weight_gib']:.1f} GiB loaded" in plan.markdown()  # what sizes its memory, in words
        verdicts.append("fits" if plan.fits else plan.refusal.stage)
    assert tuple(verdicts) == VERDICTS[name], verdicts


def test_a_mixture_of_experts_is_timed_by_the_parameters_a_token_runs(shapes):
    """Qwen3-30B-A3B runs 3.35B of its 30.5B parameters a token: its teacher-forced pass is timed at that."""
    from draftsync.planning.sync_plan import SERVER_START_S, plan_sync
    from draftsync.planning.target_shape import TargetShape
    from draftsync.planning.worker import Worker
    from draftsync.profiles import profile

    shape = shapes["qwen3-30b-a3b"]
    dense = TargetShape(**{**vars(shape), "active_parameters": 0})  # the same target, timed as if dense
    worker, production = Worker(1, 80, 512, 8000), profile("production")
    hours = {
        which: {s.stage: s.hours_estimate for s in plan_sync(target, worker, production).stages}
        for which, target in (("moe", shape), ("dense", dense))
    }
    ratio = shape.parameters / shape.active_parameters
    assert hours["dense"]["hidden_states"] == pytest.approx(ratio * hours["moe"]["hidden_states"], rel=1e-6)
    # the validation's decoding, beside its ten server starts (seven gammas, the knee, stress, the schedule's relaunch)
    started = 10 * SERVER_START_S / 3600
    decoding = {which: hours[which]["validation"] - started for which in hours}
    assert decoding["dense"] == pytest.approx(ratio * decoding["moe"], rel=1e-6)


def test_deepseek_v3_says_what_it_does_with_its_mla_and_mtp_layers(published, tmp_path):
    code, plan, output = _plan(published / "deepseek-v3", 8, tmp_path / "plan.json")
    assert code == 1 and "MLA attention: 70,272 bytes of latent KV cache a token" in output
    assert "its own MTP head (deepseek_v3): 1 layer(s)" in output and "a head draftsync does not refresh" in output
    assert "mixture-of-experts" in plan["refusal"]["message"] and plan["refusal"]["fix"]


def test_a_dflash_sync_vllm_could_not_serve_beside_a_windowed_target_is_refused_by_its_plan(published, tmp_path):
    """vLLM 0.32 puts a DFlash drafter's layers in one KV cache group with the target's full-attention layers; beside
    a small gpt-oss (2 windowed, 2 full layers) its 2 layers would be split, so the sync is refused before it trains.
    gpt-oss-20b (12 and 12) holds them."""
    import transformers
    from draftsync.errors import DraftsyncError
    from draftsync.planning.sync_plan import plan_sync
    from draftsync.planning.target_shape import TargetShape
    from draftsync.planning.worker import Worker
    from draftsync.profiles import profile

    small = transformers.GptOssConfig(
        vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=32,
        architectures=["GptOssForCausalLM"],
    )  # fmt: skip
    small.save_pretrained(tmp_path / "small-gpt-oss")
    dflash = profile("production").model_copy(update={"method": "dflash"})
    worker = Worker(1, 80, 512, 8000)
    with pytest.raises(DraftsyncError, match="splits a 2-layer DFlash drafter across KV cache groups") as refused:
        plan_sync(TargetShape.from_directory(tmp_path / "small-gpt-oss"), worker, dflash)
    assert "method eagle3" in refused.value.fix
    assert plan_sync(TargetShape.from_directory(published / "gpt-oss-20b"), worker, dflash).fits
