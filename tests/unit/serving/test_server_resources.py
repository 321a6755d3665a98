"""What a sync's plan gives the vLLM servers it starts: the context length their KV cache is sized for, and the
GPUs they see, counted inside the worker's own visible set."""

from __future__ import annotations

import json

import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.vllm_args import ServerResources, render_vllm_command
from draftsync.speculative import placement

PLANNED = {"devices": [0, 1], "tensor_parallel_size": 2, "gpu_memory_utilization": 0.88, "max_model_len": 4672}


@pytest.fixture
def target(tmp_path):
    directory = tmp_path / "target"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return directory


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, argv
    return argv[argv.index(flag) + 1]


def test_the_plans_context_length_reaches_every_server_the_sync_starts(target, tmp_path):
    from draftsync.serving.vllm_evaluation import VllmBackend
    from draftsync.serving.vllm_responses import VllmResponseWriter

    resources = ServerResources.from_plan(PLANNED)
    rendered = render_vllm_command(
        target,
        port=8000,
        served_model_name="t",
        tensor_parallel_size=resources.tensor_parallel_size,
        extra_args=resources.extra_args(),
    ).argv
    validation = VllmBackend(target, method="ngram", log_dir=tmp_path, resources=resources).launch(2, 8000).argv
    writer = VllmResponseWriter(target, tmp_path, resources=resources)
    for argv in (rendered, validation):
        assert _value(argv, "--max-model-len") == "4672"
    for argv in (rendered, validation, writer.launch(8000).argv):
        assert _value(argv, "--max-model-len") == "4672"
        assert _value(argv, "--gpu-memory-utilization") == "0.88"
        assert _value(argv, "--tensor-parallel-size") == "2"
    assert "--max-model-len" not in ServerResources.from_plan({"devices": [0]}).extra_args()


def test_the_plans_context_length_replaces_one_a_caller_passed_so_it_is_written_once(target, tmp_path):
    """The plan sized the KV cache for its own length: a deployment's longer one could not fit beside the weights."""
    from draftsync.serving.vllm_evaluation import VllmBackend

    resources = ServerResources.from_plan(PLANNED)
    extra = ["--max-model-len", "8192", "--max_model_len=16384", "--gpu-memory-utilization=0.5", "--enforce-eager"]
    argv = VllmBackend(target, method="ngram", log_dir=tmp_path, extra_args=extra, resources=resources)
    argv = argv.launch(0, 8000).argv
    assert _value(argv, "--max-model-len") == "4672" and _value(argv, "--gpu-memory-utilization") == "0.88"
    assert "8192" not in argv and not any("16384" in arg or "0.5" in arg for arg in argv)
    assert "--enforce-eager" in argv
    unplanned = VllmBackend(target, method="ngram", log_dir=tmp_path, extra_args=extra[:2]).launch(0, 8000).argv
    assert _value(unplanned, "--max-model-len") == "8192"  # without a planned length, the caller's stands


@pytest.mark.parametrize("length", [0, -1, "long", True])
def test_a_planned_context_length_that_is_not_a_positive_integer_is_refused(length):
    with pytest.raises(DraftsyncError, match="max_model_len"):
        ServerResources.from_plan({**PLANNED, "max_model_len": length})


def test_the_plans_devices_count_inside_the_workers_visible_gpus():
    assert placement.visible_devices((0, 1), {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == "4,5"
    assert placement.visible_devices((1, 3), {"CUDA_VISIBLE_DEVICES": " 4, 5 ,6,7"}) == "5,7"
    uuids = "GPU-8f3e2c1a-0000-1111-2222-333344445555,GPU-1b2c3d4e-aaaa-bbbb-cccc-ddddeeeeffff"
    assert placement.visible_devices((1,), {"CUDA_VISIBLE_DEVICES": uuids}) == uuids.split(",")[1]
    mig = "MIG-0c9d8e7f-1111-2222-3333-444455556666"
    assert placement.visible_devices((0,), {"CUDA_VISIBLE_DEVICES": mig}) == mig
    assert placement.visible_devices((0, 1), {}) == "0,1"  # unset: the worker sees every GPU, numbered as the plan's


@pytest.mark.parametrize(
    ("visible", "names"),
    [("4", "names 1 GPU"), ("", "names no GPU"), ("-1", "names no GPU"), ("2,-1,3", "names 1 GPU")],
)
def test_a_plan_asking_for_more_gpus_than_the_worker_sees_is_refused_naming_both(visible, names):
    with pytest.raises(DraftsyncError) as error:
        placement.visible_devices((0, 1), {"CUDA_VISIBLE_DEVICES": visible}, "the validation server")
    assert "the validation server on GPUs 0,1" in error.value.what
    assert f"CUDA_VISIBLE_DEVICES={visible}" in error.value.what and names in error.value.what
    assert "CUDA_VISIBLE_DEVICES" in error.value.fix


def test_a_server_is_started_on_the_plans_gpus_as_the_worker_sees_them(monkeypatch):
    resources = ServerResources.from_plan({"devices": [0, 1], "tensor_parallel_size": 2})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    assert resources.environment() == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert resources.environment({"CUDA_VISIBLE_DEVICES": "6,7"}) == {"CUDA_VISIBLE_DEVICES": "6,7"}
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert resources.environment() == {"CUDA_VISIBLE_DEVICES": "0,1"}
    assert ServerResources().environment({"CUDA_VISIBLE_DEVICES": ""}) == {}  # no devices planned: nothing set
