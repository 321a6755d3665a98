"""The rendered `vllm serve` command: long form, real SpeculativeConfig keys, argv only."""

import json
import shlex

import pytest

from draftsync.errors import DraftsyncError
from draftsync.serving.vllm_args import render_vllm_command

# Field names of vLLM's `SpeculativeConfig` (vllm/config/speculative.py, vLLM 0.33) that a user may set
# on the command line; the rendered JSON must use nothing else.
SPECULATIVE_CONFIG_FIELDS = {
    "enforce_eager",
    "num_speculative_tokens",
    "model",
    "method",
    "draft_tensor_parallel_size",
    "quantization",
    "max_model_len",
    "revision",
    "code_revision",
    "disable_padded_drafter_batch",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "parallel_drafting",
    "num_speculative_tokens_per_batch_size",
    "rejection_sample_method",
    "draft_sample_method",
}


def speculative_json(argv: list[str]) -> dict:
    return json.loads(argv[argv.index("--speculative-config") + 1])


@pytest.mark.parametrize("method, vllm_method", [("eagle3", "eagle3"), ("eagle3.1", "eagle3"), ("eagle", "eagle")])
def test_long_form_with_speculative_config(method, vllm_method):
    launch = render_vllm_command("/models/target", "/models/drafter", method, 4, "0.0.0.0", 8000, "tiny")
    assert launch.argv[:3] == ["vllm", "serve", "/models/target"]
    assert launch.argv[launch.argv.index("--host") + 1] == "0.0.0.0"
    assert launch.argv[launch.argv.index("--port") + 1] == "8000"
    assert launch.argv[launch.argv.index("--served-model-name") + 1] == "tiny"
    config = speculative_json(launch.argv)
    assert config == {"method": vllm_method, "model": "/models/drafter", "num_speculative_tokens": 4}
    assert config == launch.speculative_config
    assert set(config) <= SPECULATIVE_CONFIG_FIELDS


def test_tensor_parallel_sets_the_draft_degree_too():
    launch = render_vllm_command("/t", "/d", "eagle3", 3, "127.0.0.1", 9000, "m", tensor_parallel_size=2)
    assert launch.argv[launch.argv.index("--tensor-parallel-size") + 1] == "2"
    config = speculative_json(launch.argv)
    assert config["draft_tensor_parallel_size"] == 2
    assert set(config) <= SPECULATIVE_CONFIG_FIELDS


def test_no_drafter_means_no_speculation():
    launch = render_vllm_command("/t", None, "eagle3", 3, "127.0.0.1", 9000, "m", extra_args=["--max-model-len", "512"])
    assert "--speculative-config" not in launch.argv
    assert launch.speculative_config is None
    assert launch.argv[-2:] == ["--max-model-len", "512"]


def test_paths_with_shell_metacharacters_stay_single_arguments():
    drafter = "/tmp/d r'a\"f;ter $(rm -rf ~)"
    target = "/tmp/t a`rg`et|x"
    launch = render_vllm_command(target, drafter, "eagle3", 2, "127.0.0.1", 9000, "m")
    assert launch.argv[2] == target
    assert speculative_json(launch.argv)["model"] == drafter
    assert shlex.split(shlex.join(launch.argv)) == launch.argv
    assert all(isinstance(arg, str) for arg in launch.argv)


def test_medusa_is_refused_with_the_fix():
    with pytest.raises(DraftsyncError, match="no medusa support"):
        render_vllm_command("/t", "/d", "medusa", 2, "127.0.0.1", 9000, "m")
