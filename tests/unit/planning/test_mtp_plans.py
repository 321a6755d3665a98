"""`draftsync plan` on config-only targets that ship their own MTP head (DeepSeek-V3, Qwen 3.5 dense and MoE), on
8 x 80 GB: the head's weights, what refreshing it takes (its training step's memory) and whether that fits, and the
verdict (the sync refuses all three families today)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from tests.support.published_targets import save_mtp_configs

GiB = 1024**3


@pytest.fixture(scope="module")
def mtp_targets(tmp_path_factory):
    return save_mtp_configs(tmp_path_factory.mktemp("mtp"))


def _plan(directory, out) -> tuple[int, dict, str]:
    from draftsync.cli.app import app

    argv = ["plan", str(directory), "--profile", "production", "--gpus", "8", "--gpu-memory-gb", "80"]
    argv += ["--host-memory-gb", "512", "--disk-gb", "8000", "--json", str(out)]
    result = CliRunner().invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(out.read_text()), result.output


def _stage(plan: dict, name: str) -> dict:
    return next(stage for stage in plan["stages"] if stage["stage"] == name)


def test_deepseek_v3s_head_and_its_refresh_are_sized_and_the_node_cannot_hold_the_target(mtp_targets, tmp_path):
    code, plan, output = _plan(mtp_targets / "deepseek-v3", tmp_path / "plan.json")
    head = plan["target_facts"]["mtp_head"]
    assert head == {
        "family": "deepseek_v3",
        "layers": 1,
        "served_layers": 1,
        "reads": "final",
        "refreshed_by_draftsync": False,
    }
    # its model card's 14B MTP module is this layer and its own copies of the embedding and lm_head (0.93B each)
    assert plan["target_facts"]["mtp_parameters"] == pytest.approx(11.6e9, rel=0.01)
    assert "11.61B parameters, 10.91 GiB as stored" in output  # fp8 like the decoder's linear layers
    # refreshing its 256-expert layer: its weights, gradients and AdamW in fp32 alone are 186 GB, over one GPU
    assert _stage(plan, "training")["gpu_gib"] > 80
    # the refresh's stages do not fit: 627 GiB of fp8 weights on 8 x 80 GiB, for the target's hidden states
    assert "on this worker its stages do not fit: the sync's hidden_states stage needs 706 GiB" in output
    assert code == 1 and plan["refusal"]["stage"] == "target"  # and the sync refuses its family outright
    assert "mixture-of-experts" in plan["refusal"]["message"]


@pytest.mark.parametrize(
    ("name", "billions", "stored_gib"), [("qwen3.5-27b", 0.42, 0.79), ("qwen3.5-35b-a3b", 0.84, 1.57)]
)
def test_a_qwen35_head_is_sized_and_its_refresh_fits_eight_gpus(mtp_targets, tmp_path, name, billions, stored_gib):
    code, plan, output = _plan(mtp_targets / name, tmp_path / "plan.json")
    head = plan["target_facts"]["mtp_head"]
    assert head["family"] == "qwen3_5" and head["reads"] == "final" and head["served_layers"] == 1
    assert f"{billions:.2f}B parameters, {stored_gib:.2f} GiB as stored" in output
    training = _stage(plan, "training")
    assert 0 < training["gpu_gib"] <= 0.9 * 80 and training["settings"]["train_processes"] == 8
    assert f"{training['gpu_gib']:.1f} GiB for its training step" in plan["reasons"]["mtp_head"]
    assert plan["reasons"]["mtp_head"].endswith("on this worker its stages fit")  # memory is not what stops it
    assert code == 1 and plan["refusal"]["stage"] == "target"  # the sync refuses a multimodal target
    assert "multimodal" in plan["refusal"]["message"]


def test_a_head_of_more_layers_than_vllm_serves_is_refused_before_a_plan(mtp_targets, tmp_path):
    config = json.loads((mtp_targets / "qwen3.5-27b" / "config.json").read_text())
    config["text_config"]["mtp_num_hidden_layers"] = 2
    (tmp_path / "two").mkdir()
    (tmp_path / "two" / "config.json").write_text(json.dumps(config))
    from draftsync.cli.app import app
    from draftsync.errors import DraftsyncError

    result = CliRunner().invoke(app, ["plan", str(tmp_path / "two"), "--gpus", "8", "--gpu-memory-gb", "80"])
    assert isinstance(result.exception, DraftsyncError)  # what the command line prints with its fix
    assert "declares 2 MTP layers (mtp_num_hidden_layers)" in result.exception.what
    assert "set mtp_num_hidden_layers to 1" in result.exception.fix
