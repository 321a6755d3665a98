"""The GPUs a sync's plan gives the vLLM servers it starts reach their command line and environment."""

from __future__ import annotations

import json
from pathlib import Path

from draftsync.serving.deployment import ServingDeployment
from draftsync.serving.vllm_args import ServerResources


def test_the_plans_servers_become_devices_tensor_parallelism_and_a_memory_fraction():
    planned = ServerResources.from_plan({"devices": [2, 3], "tensor_parallel_size": 2, "gpu_memory_utilization": 0.41})
    assert planned.environment(parent={}) == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert planned.extra_args() == ["--gpu-memory-utilization", "0.41"]
    assert ServerResources.from_plan(None) == ServerResources()
    assert ServerResources().environment() == {} and ServerResources().extra_args() == []


def test_the_plans_data_parallel_replicas_become_one_server_over_every_planned_gpu(tmp_path):
    """Four replicas at tensor parallelism 2 on GPUs 0-7: one `vllm serve` with both sizes, seeing all eight."""
    from draftsync.serving.vllm_states import VllmStateReader

    from tests.support.tiny_models import build_tiny_target

    planned = ServerResources.from_plan(
        {"devices": list(range(8)), "tensor_parallel_size": 2, "data_parallel_size": 4, "max_model_len": 4096}
    )
    assert planned.environment(parent={}) == {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    target = build_tiny_target(tmp_path / "target")
    argv = VllmStateReader(target, (1, 2, 3, 4), tmp_path / "states", resources=planned).launch(8000).argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--data-parallel-size") + 1] == "4"
    assert argv[argv.index("--max-model-len") + 1] == "4096"
    transfer = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert transfer["kv_connector_module_path"] == "draftsync_hidden_states"
    assert transfer["kv_connector_extra_config"]["shared_storage_path"] == str(tmp_path / "states" / "states")
    speculative = json.loads(argv[argv.index("--speculative-config") + 1])
    assert speculative["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3, 4]


def test_a_validation_server_is_launched_with_the_plans_resources(tmp_path):
    from draftsync.serving.vllm_evaluation import VllmBackend

    from tests.support.tiny_models import build_tiny_drafter, build_tiny_target

    target = build_tiny_target(tmp_path / "target")
    drafter = build_tiny_drafter(target, tmp_path / "drafter", gamma=2)
    resources = ServerResources((0, 1), 2, 0.45)
    argv = VllmBackend(target, drafter, log_dir=tmp_path, resources=resources).launch(2, 8000).argv
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[argv.index("--gpu-memory-utilization") + 1] == "0.45"
    assert '"draft_tensor_parallel_size": 2' in argv[argv.index("--speculative-config") + 1]


def test_a_serving_deployment_says_what_gpu_memory_it_holds():
    def deployment(**fields) -> ServingDeployment:
        return ServingDeployment(name="chat", target_name="llm", **fields)

    assert deployment(launch="vllm").gpu_memory_fraction() == 0.9  # vLLM's default
    assert deployment(launch="vllm", extra_vllm_args=["--gpu-memory-utilization", "0.5"]).gpu_memory_fraction() == 0.5
    assert deployment(launch="vllm", extra_vllm_args=["--gpu-memory-utilization=0.3"]).gpu_memory_fraction() == 0.3
    assert deployment(launch="reference").gpu_memory_fraction() is None


def test_the_validation_keeps_one_request_a_data_parallel_replica_in_flight(tmp_path):
    """A server with 3 replicas gets the checklist's requests 3 at a time (each replica decodes one alone), in order;
    one replica gets them one by one. Against a loopback stand-in for `vllm serve` that counts them."""
    import sys

    from draftsync.serving.evaluation import EvalRequest
    from draftsync.serving.vllm_engine import VllmEngine
    from draftsync.serving.vllm_evaluation import VllmBackend

    from tests.support.tiny_models import build_tiny_target

    target = build_tiny_target(tmp_path / "target")
    requests = [EvalRequest(f"def f{i}(x):", "code", 3) for i in range(9)]
    for replicas in (3, 1):
        record = tmp_path / f"in-flight-{replicas}.json"
        stand_in = (sys.executable, str(Path(__file__).parents[2] / "support" / "counting_vllm.py"))
        engine = VllmEngine(command=stand_in, interpreter=False, device="cuda", cpu_args=(("--record", str(record)),))
        backend = VllmBackend(
            target,
            None,
            method="ngram",
            log_dir=tmp_path / f"logs-{replicas}",
            engine=engine,
            resources=ServerResources(data_parallel_size=replicas),
        )
        try:
            results = backend.generate(requests, 0, 0.0, seed=0)
        finally:
            backend.close()
        assert [r.index for r in results] == list(range(9)) and all(r.output_tokens == 3 for r in results)
        counted = json.loads(record.read_text())
        assert counted["requests"] == 2 + 9 and counted["most"] == replicas  # two warm-up requests, then the nine
