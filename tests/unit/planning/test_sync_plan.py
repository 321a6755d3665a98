"""`draftsync plan` on real model shapes: config-only checkpoints made from transformers' own config classes, planned
for the workers a platform team runs, and refused, before anything runs, where a stage cannot fit."""

from __future__ import annotations

import json

import pytest
from draftsync.planning.sync_plan import plan_sync
from draftsync.planning.target_shape import TargetShape
from draftsync.planning.worker import HeldMemory, Worker
from draftsync.profiles import profile
from draftsync.speculative.methods import DFLASH_LAYERS
from transformers import LlamaConfig
from typer.testing import CliRunner

LLAMA_31 = dict(vocab_size=128256, num_key_value_heads=8, max_position_embeddings=131072, dtype="bfloat16")
SHAPES = {
    "llama-3.1-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32),
    "llama-3.1-70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64),
}


@pytest.fixture(scope="module")
def config_only(tmp_path_factory):
    """Config-only checkpoint directories of Llama-3.1-8B and -70B (no weights: the plan reads config.json)."""
    root = tmp_path_factory.mktemp("config-only")
    for name, shape in SHAPES.items():
        LlamaConfig(**LLAMA_31, **shape).save_pretrained(root / name)
    return root


def plan_json(directory, tmp_path, *worker: str) -> tuple[int, dict, str]:
    from draftsync.cli.app import app

    out = tmp_path / "plan.json"
    # worker flags may override; no vLLM unless a test names one, whatever this machine has
    fixed = ["--profile", "production", "--host-memory-gb", "256", "--disk-gb", "4000", "--vllm-version", "none"]
    argv = ["plan", str(directory), *fixed, *worker, "--json", str(out)]
    result = CliRunner().invoke(app, argv)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, json.loads(out.read_text()), result.output


def stage(plan: dict, name: str) -> dict:
    return next(s for s in plan["stages"] if s["stage"] == name)


def test_llama_8b_on_one_80gb_gpu_fits_with_the_whole_batch_in_one_step(config_only, tmp_path):
    code, plan, output = plan_json(config_only / "llama-3.1-8b", tmp_path, "--gpus", "1", "--gpu-memory-gb", "80")
    assert code == 0 and plan["fits"] and "Verdict: fits" in output
    assert 8.0e9 < plan["parameters"] < 8.1e9  # Llama-3.1-8B's 8.03B, counted from its config
    settings = plan["settings"]
    assert settings["target_devices"] == ["cuda:0"] and settings["target_dtype"] == "bfloat16"
    assert settings["batch_tokens"] == 16 * 2048 and settings["accumulation"] == 1
    assert not settings["activation_checkpointing"]
    assert 14.9 < stage(plan, "hidden_states")["gpu_gib"] < 20  # 16-bit weights (14.96 GiB) and one pass
    assert stage(plan, "training")["gpu_gib"] <= 78
    assert stage(plan, "hidden_states")["disk_gib"] > 100  # 32,773 bytes a token: hundreds of GiB
    assert stage(plan, "responses")["settings"]["responses"] < profile("production").generated_samples  # distinct
    assert all(s["hours_estimate"] > 0 for s in plan["stages"])
    assert plan["gpus_used"] == 1 and "the plan uses 1 GPU(s) of a node" in output


def test_llama_8b_on_one_24gb_gpu_trains_in_micro_batches(config_only, tmp_path):
    code, plan, _ = plan_json(config_only / "llama-3.1-8b", tmp_path, "--gpus", "1", "--gpu-memory-gb", "24")
    assert code == 0 and plan["fits"]
    settings = plan["settings"]
    assert settings["batch_tokens"] * settings["accumulation"] >= 16 * 2048 > settings["batch_tokens"]
    assert stage(plan, "training")["gpu_gib"] <= 22  # 24 less the reserve
    assert stage(plan, "responses")["settings"]["gpu_memory_utilization"] <= 0.9


def test_llama_70b_on_one_80gb_gpu_is_refused_naming_the_stage_and_the_numbers(config_only, tmp_path):
    code, plan, output = plan_json(config_only / "llama-3.1-70b", tmp_path, "--gpus", "1", "--gpu-memory-gb", "80")
    assert code == 1 and not plan["fits"] and "refused" in output
    refusal = plan["refusal"]
    assert refusal["stage"] == "hidden_states"
    needed = float(refusal["needed"].split(" GiB")[0])
    assert needed > 131  # the 16-bit weights alone are 131 GiB
    assert "78.0 GiB free on 1 x 80 GiB" in refusal["available"]
    assert "2 x 80 GiB" in refusal["fix"]


def test_llama_70b_on_eight_80gb_gpus_spreads_the_target_and_splits_the_servers(config_only, tmp_path):
    code, plan, _ = plan_json(config_only / "llama-3.1-70b", tmp_path, "--gpus", "8", "--gpu-memory-gb", "80")
    assert code == 0 and plan["fits"]
    settings = plan["settings"]
    assert settings["target_devices"] == ["cuda:0", "cuda:1"] and "device_map" in settings["target_placement"]
    assert settings["servers"]["tensor_parallel_size"] == 2 and settings["servers"]["devices"] == list(range(8))
    assert settings["servers"]["data_parallel_size"] == 4  # the validation's requests 4 at a time, one a replica
    assert stage(plan, "training")["gpu_gib"] <= 78
    # one torchrun rank per GPU trains, and the plan says why of each choice and renders what it would run
    assert settings["train_processes"] == 8
    reasons = plan["reasons"]
    assert "exceed one GPU's 78.0 GiB free" in reasons["target"] and "device_map" in reasons["target"]
    assert "tensor parallelism 2" in reasons["servers"] and "64 attention heads" in reasons["servers"]
    assert "4 data-parallel replica(s) over every GPU that holds one (GPUs 0,1; 2,3; 4,5; 6,7)" in reasons["servers"]
    assert reasons["hidden_states"].startswith("offline: 1,738 GiB of shards")
    assert "8 torchrun ranks, one per GPU" in reasons["training"]
    server = plan["commands"]["vllm_server"]
    assert (
        server.startswith("CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7 vllm serve ") and "--tensor-parallel-size 2" in server
    )
    assert server.endswith("--data-parallel-size 4")
    assert "--gpu-memory-utilization 0.9" in server
    assert (
        "-m torch.distributed.run --standalone --nproc-per-node=8 -m draftsync.speculative.train.ranks"
        in (plan["commands"]["training"])
    )


def test_llama_70b_on_two_nodes_of_eight_gpus_trains_on_sixteen_ranks_through_a_c10d_rendezvous(config_only, tmp_path):
    code, plan, output = plan_json(
        config_only / "llama-3.1-70b", tmp_path, "--gpus", "8", "--gpu-memory-gb", "80", "--nodes", "2"
    )
    assert code == 0 and plan["worker"]["nodes"] == 2 and "2 nodes of 8 x 80 GiB GPU" in output
    assert plan["settings"]["train_processes"] == 16 and "on each of 2 nodes" in plan["reasons"]["training"]
    training = plan["commands"]["training"]
    assert "--nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d '--rdzv-endpoint=<first node>:29400'" in training
    assert "--rdzv-conf=join_timeout=300" in training  # a node that cannot reach the rendezvous gives up, naming it
    one_node = plan_json(config_only / "llama-3.1-70b", tmp_path, "--gpus", "8", "--gpu-memory-gb", "80")[1]
    assert stage(plan, "training")["hours_estimate"] < stage(one_node, "training")["hours_estimate"]


def test_a_disk_too_small_for_the_shards_trains_online_or_refuses_when_offline_is_asked(config_only, tmp_path):
    code, plan, _ = plan_json(
        config_only / "llama-3.1-8b", tmp_path, "--gpus", "1", "--gpu-memory-gb", "80", "--disk-gb", "100"
    )
    assert code == 0 and plan["settings"]["hidden_states"] == "online"
    assert (
        stage(plan, "hidden_states")["settings"]["bytes_per_token"] == 5
        and stage(plan, "hidden_states")["disk_gib"] < 1
    )
    assert (
        plan["reasons"]["hidden_states"].startswith("online: ")
        and "exceed the 100 GiB of disk" in (plan["reasons"]["hidden_states"])
    )
    # online, the target stays on the GPU through training, and the step's budget is what it leaves
    offline = plan_json(config_only / "llama-3.1-8b", tmp_path, "--gpus", "1", "--gpu-memory-gb", "80")[1]
    assert offline["settings"]["hidden_states"] == "offline"
    assert plan["settings"]["batch_tokens"] <= offline["settings"]["batch_tokens"]

    target = TargetShape.from_directory(config_only / "llama-3.1-8b")
    asked = profile("production").model_copy(update={"hidden_states": "offline"})
    refused = plan_sync(target, Worker(1, 80, 256, 100), asked, 1000)
    assert refused.refusal.stage == "hidden_states"
    assert "GiB of disk for" in refused.refusal.needed and "32,773 bytes each" in refused.refusal.needed
    assert refused.refusal.available == "100 GiB free"


def test_a_gpu_held_by_a_serving_deployment_is_named_with_what_it_holds(config_only):
    target = TargetShape.from_directory(config_only / "llama-3.1-8b")
    free = plan_sync(target, Worker(1, 24, 256, 4000), profile("production"), 1000)
    assert free.fits
    held = Worker(1, 24, 256, 4000, held=(HeldMemory("chat", 1, 12.0),))
    refused = plan_sync(target, held, profile("production"), 1000)
    assert not refused.fits
    assert "serving deployment chat holds 12.0 GiB" in refused.refusal.available
    assert "chat" in refused.refusal.fix
    with pytest.raises(Exception, match="no dataset was written and no training started"):
        refused.require_fit()


def test_the_plan_counts_the_parameters_a_real_model_has():
    import torch
    from transformers import LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        vocab_size=1000,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    shape = TargetShape.from_directory(_saved(config))
    assert shape.parameters == sum(p.numel() for p in model.parameters())


def _saved(config):
    import tempfile
    from pathlib import Path

    directory = Path(tempfile.mkdtemp())
    config.save_pretrained(directory)
    return directory


def test_ranks_share_adams_state_out_with_fsdp_only_where_no_step_holding_it_whole_fits(config_only):
    """8B's drafter: about 10.5 GiB a step at one checkpointed window with AdamW whole (DDP); 12 GB GPUs leave less."""
    target = TargetShape.from_directory(config_only / "llama-3.1-8b")
    roomy = plan_sync(target, Worker(8, 16, 256, 4000), profile("production"), 1000)
    assert roomy.refusal is None and roomy.settings["data_parallel"] == "ddp"
    assert "DistributedDataParallel" in roomy.reasons["training"]

    tight = plan_sync(target, Worker(8, 12, 256, 4000), profile("production"), 1000)
    assert tight.refusal is None and tight.settings["data_parallel"] == "fsdp"
    assert "FSDP2 shares AdamW's state out" in tight.reasons["training"]
    assert tight.profile_updates()["data_parallel"] == "fsdp"
    training = next(s for s in tight.stages if s.stage == "training")
    assert training.gpu_gib <= 12

    whole = profile("production").model_copy(update={"data_parallel": "ddp"})
    refused = plan_sync(target, Worker(8, 12, 256, 4000), whole, 1000)
    assert refused.refusal is not None and refused.refusal.stage == "training"


def test_a_plan_across_nodes_gives_the_profile_a_nodes_ranks_and_the_nodes(config_only):
    from dataclasses import replace

    target = TargetShape.from_directory(config_only / "llama-3.1-70b")
    plan = plan_sync(target, replace(Worker(8, 80, 512, 8000), nodes=2), profile("production"), 1000)
    assert plan.settings["train_processes"] == 16
    assert {k: plan.profile_updates()[k] for k in ("train_processes", "train_nodes")} == {
        "train_processes": 8,
        "train_nodes": 2,
    }


def test_a_profile_asking_for_the_speculators_trainer_gets_its_pipeline_rendered(config_only, tmp_path):
    asked = tmp_path / "speculators.yaml"
    asked.write_text("trainer: speculators\n")
    code, plan, _ = plan_json(
        config_only / "llama-3.1-70b", tmp_path, "--gpus", "8", "--gpu-memory-gb", "80", "--profile", str(asked)
    )
    assert code == 0 and plan["settings"]["trainer"] == "speculators"
    assert plan["reasons"]["training"].startswith("speculators' trainer (the profile asks)")
    commands = plan["commands"]
    server = commands["speculators_vllm_server"]
    assert server.startswith("vllm serve") and "extract_hidden_states" in server
    assert f"--tensor-parallel-size {plan['settings']['servers']['tensor_parallel_size']}" in server
    assert commands["speculators_prepare_data"].startswith("speculators prepare-data")
    assert "torchrun" in commands["training"] and "--nproc-per-node 8" in commands["training"]


def test_online_states_keep_ranks_only_where_each_can_hold_the_whole_target(config_only):
    """Online, a rank computes its batches' states, so it holds the whole target: 8B fits beside a rank on each of 8
    GPUs; 70B runs over 2 GPUs through a device_map, which no rank of its own could hold, so it trains in one
    process. On a CPU each online rank's fp32 copy counts against host memory."""
    online = profile("production").model_copy(update={"hidden_states": "online"})
    small = plan_sync(TargetShape.from_directory(config_only / "llama-3.1-8b"), Worker(8, 80, 512, 8000), online, 1000)
    assert small.refusal is None and small.settings["train_processes"] == 8
    large = plan_sync(TargetShape.from_directory(config_only / "llama-3.1-70b"), Worker(8, 80, 512, 8000), online, 1000)
    assert large.refusal is None and large.settings["target_devices"] == ["cuda:0", "cuda:1"]
    assert large.settings["train_processes"] == 1 and "no rank of its own could hold it" in large.reasons["training"]
    assert large.settings["training_device"] == "cuda:2"  # the first GPU the target leaves whole
    offline = profile("production").model_copy(update={"hidden_states": "offline"})
    spread = plan_sync(
        TargetShape.from_directory(config_only / "llama-3.1-70b"), Worker(8, 80, 512, 8000), offline, 1000
    )
    assert spread.settings["train_processes"] == 8  # offline, a rank reads only the target's head

    cpu_ranks = {"train_processes": 4}
    eight_b = TargetShape.from_directory(config_only / "llama-3.1-8b")  # 32 GB in fp32 on a CPU
    on_cpu = online.model_copy(update=cpu_ranks)
    refused = plan_sync(eight_b, Worker(0, 0, 100, 8000), on_cpu, 1000)
    assert refused.refusal is not None and refused.refusal.stage == "training"
    assert plan_sync(eight_b, Worker(0, 0, 100, 8000), offline.model_copy(update=cpu_ranks), 1000).refusal is None


def test_a_target_planned_from_its_registry_tags_is_planned_as_from_its_config(config_only):
    """A sync request sizes its GPUs from the version's tags, before any file is fetched: the same shape, and so the
    same plan, as from the checkpoint; versions tagged before the features named the heads and the MLP width too."""
    from dataclasses import fields

    from draftsync.speculative.families import config_features

    def sized(shape: TargetShape) -> dict:
        return {f.name: getattr(shape, f.name) for f in fields(shape) if f.name not in ("config", "description")}

    def planned(shape: TargetShape) -> dict:
        return {k: v for k, v in plan_sync(shape, worker, production).to_dict().items() if k != "target_facts"}

    production = profile("production")
    worker = Worker(8, 80, 1e9, 1e9)
    for name in SHAPES:
        from_files = TargetShape.from_directory(config_only / name, name)
        assert from_files.description is not None
        features = {**config_features(from_files.config), **from_files.description.size_features()}
        older = {
            k: v
            for k, v in config_features(from_files.config).items()
            if k not in ("attention_heads", "intermediate_size")
        }
        for tagged in (features, older):
            shape = TargetShape.from_registered(
                name,
                parameters=from_files.parameters,
                hidden=from_files.hidden,
                layers=from_files.layers,
                vocab=from_files.vocab,
                features=tagged,
            )
            if tagged is features:
                assert sized(shape) == sized(from_files), (name, tagged)
            assert planned(shape) == planned(from_files)


def test_a_plan_says_how_many_gpus_of_its_node_it_uses(config_only):
    """The count a sync asks its work pool for: every GPU any stage names is below it."""
    eight = TargetShape.from_directory(config_only / "llama-3.1-8b")
    seventy = TargetShape.from_directory(config_only / "llama-3.1-70b")
    production = profile("production")
    node = Worker(8, 80, 1e9, 1e9)

    def used(target, batch_size: int, worker: Worker = node) -> int:
        plan = plan_sync(target, worker, production.model_copy(update={"batch_size": batch_size}))
        assert plan.fits
        return plan.gpus_used

    assert used(eight, production.batch_size) == 8  # a DDP rank on every GPU
    # the servers' data-parallel replicas take every GPU that holds one, however few ranks train
    assert used(eight, 3) == 8 and used(eight, 1) == 8
    assert used(seventy, 1) == 8  # four replicas at TP 2
    assert used(eight, 1, Worker(3, 80, 1e9, 1e9)) == 3
    # a serving deployment holding half of GPUs 0-1 leaves them no room for a replica: three, on GPUs 2-7
    held = plan_sync(seventy, Worker(8, 80, 1e9, 1e9, held=(HeldMemory("chat", 2, 40.0),)), production)
    assert held.fits and held.settings["servers"]["devices"] == [2, 3, 4, 5, 6, 7]
    assert held.settings["servers"]["data_parallel_size"] == 3
    assert held.settings["target_devices"] == ["cuda:2", "cuda:3"]
    assert used(eight, 8, Worker(0, 0, 1e9, 1e9)) == 0  # a CPU worker


def test_each_stage_holds_its_gpus_alone_and_the_responses_server_never_beside_the_target(config_only):
    """The responses' vLLM server takes 0.9 of each of its GPUs at start; the transformers target comes after it stops.
    Held together, as the dataset stage once ran them, they overflow GPU 0, and the plan's check says so."""
    from draftsync.planning.stages import StagePlan, overlap_refusal

    for name, gpus in (("llama-3.1-8b", 1), ("llama-3.1-70b", 8)):
        worker = Worker(gpus, 80, 512, 8000)
        plan = plan_sync(TargetShape.from_directory(config_only / name), worker, profile("production"))
        assert plan.fits and overlap_refusal(plan.stages, worker) is None
        responses, hidden = plan.stages[0], plan.stages[1]
        assert [o.holder for o in responses.occupants] == ["responses: the vLLM server"]
        assert [o.holder for o in hidden.occupants] == ["hidden_states: the target (transformers)"]
        interleaved = StagePlan("responses", 0, 0, 0, 0, {}, responses.occupants + hidden.occupants)
        refused = overlap_refusal([interleaved], worker)
        assert refused is not None and refused.stage == "responses"
        assert "on GPU 0 at once" in refused.needed
        assert "responses: the vLLM server 72.0 GiB + hidden_states: the target (transformers)" in refused.needed
        assert "78.0 GiB free on GPU 0" in refused.available


def test_training_ranks_keep_off_the_gpus_serving_holds(config_only):
    """A deployment holding 70 GiB of GPUs 0-1 leaves them no room for a rank's step: the ranks go to GPUs 2-7."""
    from draftsync.planning.stages import overlap_refusal

    worker = Worker(8, 80, 512, 8000, held=(HeldMemory("chat", 2, 70.0),))
    plan = plan_sync(TargetShape.from_directory(config_only / "llama-3.1-8b"), worker, profile("production"))
    assert plan.fits, plan.refusal
    assert plan.settings["training_devices"] == [2, 3, 4, 5, 6, 7] and plan.settings["train_processes"] == 6
    assert plan.settings["training_device"] == "cuda:2"
    assert "GPUs 2,3,4,5,6,7, the freest that hold a step" in plan.reasons["training"]
    assert overlap_refusal(plan.stages, worker) is None
    training = next(s for s in plan.stages if s.stage == "training")
    assert all(set(o.gpus).isdisjoint({0, 1}) for o in training.occupants)


def test_servers_are_sized_for_the_context_their_stages_need(config_only):
    """--max-model-len is a prompt's room and the longest output asked; without it vLLM sizes 70B's KV for 131,072
    tokens (20 GiB a GPU at TP 2), which the plan counts when the profile asks for outputs as long as the context."""
    seventy = TargetShape.from_directory(config_only / "llama-3.1-70b")
    node = Worker(8, 80, 512, 8000)
    plan = plan_sync(seventy, node, profile("production"))
    assert plan.settings["servers"]["max_model_len"] == 2048 + 4096
    assert plan.settings["servers"]["tensor_parallel_size"] == 2
    assert seventy.kv_bytes_per_token() * 131072 / 2 / 1024**3 == 20.0
    production = profile("production")
    whole_context = production.model_copy(
        update={"validation": production.validation.model_copy(update={"long_max_tokens": None})}
    )
    longest = plan_sync(seventy, node, whole_context)
    assert longest.settings["servers"]["max_model_len"] == 131072
    assert longest.settings["servers"]["tensor_parallel_size"] == 4  # 65.7 + 20 GiB of KV do not fit 78 at TP 2


def test_a_plan_whose_stages_overflow_a_gpu_is_refused_before_any_work_naming_stages_gpu_and_gib():
    from draftsync.planning.stages import Occupant, StagePlan, overlap_refusal
    from draftsync.planning.sync_plan import SyncPlan

    worker = Worker(2, 80, 512, 8000, held=(HeldMemory("chat", 1, 20.0),))
    online = StagePlan(
        "training",
        0,
        0,
        0,
        0,
        {},
        (Occupant("hidden_states: the target, kept for online states", (0, 1), 40.0), Occupant("training", (0,), 30.0)),
    )
    refusal = overlap_refusal([online], worker)
    assert refusal is not None and refusal.stage == "training"
    assert refusal.needed == (
        "70.0 GiB on GPU 0 at once (hidden_states: the target, kept for online states 40.0 GiB + training 30.0 GiB)"
    )
    assert refusal.available == "58.0 GiB free on GPU 0 of 2 (of its 80 GiB, chat holds 20.0 GiB)"
    plan = SyncPlan("t", 1, worker, {}, (online,), refusal=refusal)
    with pytest.raises(Exception, match="no dataset was written and no training started"):
        plan.require_fit()


def test_the_ranks_launch_sees_only_the_plans_gpus_as_the_worker_numbers_them(config_only):
    """LOCAL_RANK i trains on cuda:i of what the ranks see: the launch shows them only the plan's GPUs, mapped through
    the worker's own CUDA_VISIBLE_DEVICES; a worker that sees fewer is refused, naming both."""
    from draftsync.cli.plan import rendered_commands
    from draftsync.errors import DraftsyncError
    from draftsync.speculative.train.ranks import rank_environment

    worker = Worker(8, 80, 512, 8000, held=(HeldMemory("chat", 2, 70.0),))
    plan = plan_sync(TargetShape.from_directory(config_only / "llama-3.1-8b"), worker, profile("production"))
    devices = plan.settings["training_devices"]
    assert rank_environment(devices, {}) == {"CUDA_VISIBLE_DEVICES": "2,3,4,5,6,7"}
    scheduled = {"CUDA_VISIBLE_DEVICES": "8,9,10,11,12,13,14,15"}  # a worker given the second half of a 16-GPU node
    assert rank_environment(devices, scheduled) == {"CUDA_VISIBLE_DEVICES": "10,11,12,13,14,15"}
    assert rank_environment([], scheduled) == {}  # one process on the CPU, or the plan names no GPUs
    assert rendered_commands(plan, config_only / "llama-3.1-8b")["training"].startswith(
        "CUDA_VISIBLE_DEVICES=2,3,4,5,6,7 python -m torch.distributed.run --standalone --nproc-per-node=6 "
    )
    with pytest.raises(DraftsyncError) as refused:
        rank_environment(devices, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert "puts the training ranks on GPUs 2,3,4,5,6,7" in refused.value.what
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 names 4 GPUs" in refused.value.what


def test_a_worker_that_sees_fewer_gpus_than_the_plan_uses_is_refused_before_any_work(config_only):
    from draftsync.errors import DraftsyncError

    plan = plan_sync(
        TargetShape.from_directory(config_only / "llama-3.1-70b"), Worker(8, 80, 512, 8000), profile("production")
    )
    assert plan.gpus_used == 8
    plan.require_visible({})  # unset: the worker sees every GPU
    plan.require_visible({"CUDA_VISIBLE_DEVICES": "8,9,10,11,12,13,14,15"})
    with pytest.raises(DraftsyncError) as refused:
        plan.require_visible({"CUDA_VISIBLE_DEVICES": "4,5"})
    assert "puts the sync's stages on GPUs 0,1,2,3,4,5,6,7" in refused.value.what
    assert "CUDA_VISIBLE_DEVICES=4,5 names 2 GPUs" in refused.value.what


def test_a_device_map_keeps_a_forward_pass_of_room_on_each_gpu_beside_its_layers(config_only):
    """accelerate fills each GPU up to max_memory with layers; the plan's share leaves the pass its room there."""
    from draftsync.planning.sync_plan import FORWARD_TOKENS
    from draftsync.planning.target_shape import forward_bytes

    seventy = TargetShape.from_directory(config_only / "llama-3.1-70b")
    plan = plan_sync(seventy, Worker(8, 80, 512, 8000), profile("production"))
    placement = plan.placement()
    assert placement.devices == ("cuda:0", "cuda:1")
    forward = forward_bytes(seventy, FORWARD_TOKENS) / 1024**3
    assert placement.max_memory_gib == round(78.0 - forward, 1) and 2 * placement.max_memory_gib > 1.1 * 131.4
    assert (
        plan_sync(
            TargetShape.from_directory(config_only / "llama-3.1-8b"), Worker(1, 80, 512, 8000), profile("production")
        )
        .placement()
        .max_memory_gib
        is None
    )


def _dflash(base: str = "production", **changes):
    from draftsync.profiles import with_changes

    return with_changes(profile(base), "a test", method="dflash", **changes)


def test_a_dflash_plan_sizes_its_block_objective_and_refuses_what_cannot_fit(config_only):
    """Llama-3.1-8B: DFlash's rows score over the whole vocabulary, so a larger block costs memory and time; a 28 GB
    GPU holds a block of 16's step in micro-batches; a 12 GB one is refused as for any method."""
    from draftsync.planning.training_plan import drafter_counts

    target = TargetShape.from_directory(config_only / "llama-3.1-8b")
    small, large = (plan_sync(target, Worker(1, 80, 256, 4000), _dflash(block_size=b), 1000) for b in (5, 16))
    assert small.fits and large.fits
    training = [next(s for s in plan.stages if s.stage == "training") for plan in (small, large)]
    assert training[0].hours_estimate < training[1].hours_estimate
    trainable, frozen = drafter_counts(target, _dflash())
    assert frozen == 2 * 128256 * 4096  # the target's embedding and lm_head, held frozen
    layer = 4096 * (2 * 4096 + 2 * 1024) + 3 * 4096 * 14336  # Llama-3-8B's: attention (8 KV heads) and MLP
    fc = 3 * 4096 * 4096  # over three aux states
    assert fc + DFLASH_LAYERS * layer < trainable < fc + DFLASH_LAYERS * layer + 1e6  # and the norms
    eagle3 = drafter_counts(target, profile("production"))
    assert trainable - (DFLASH_LAYERS - 1) * layer < eagle3[0]  # layer for layer smaller: no head of its own
    assert not small.settings["activation_checkpointing"]  # a block step has no layer to recompute

    fitted = plan_sync(target, Worker(1, 28, 256, 4000), _dflash(block_size=16), 1000)
    assert fitted.fits and fitted.settings["accumulation"] == 4  # the step in four micro-batches
    refused = plan_sync(target, Worker(1, 12, 256, 4000), _dflash(block_size=16), 1000)
    assert refused.refusal is not None and "no dataset was written" in _refusal_text(refused)


def _refusal_text(plan) -> str:
    from draftsync.errors import DraftsyncError

    with pytest.raises(DraftsyncError) as error:
        plan.require_fit()
    return error.value.what


@pytest.mark.parametrize(
    ("changes", "said", "fix"),
    [
        ({"aux_layer_ids": (1, 16, 40)}, "aux_layer_ids [1, 16, 40] are not distinct layers", "in 1..32"),
        ({"aux_layer_ids": (0, 16, 30)}, "can read layers 1..32", "[2, 16, 29] here"),
        ({"mask_token_id": 128256}, "mask_token_id 128256 is outside the vocabulary", "pad token"),
    ],
)
def test_dflash_settings_the_target_cannot_have_are_refused_before_any_work(config_only, changes, said, fix):
    from draftsync.errors import DraftsyncError

    target = TargetShape.from_directory(config_only / "llama-3.1-8b")
    with pytest.raises(DraftsyncError) as error:
        plan_sync(target, Worker(1, 80, 256, 4000), _dflash(**changes), 1000)
    assert said in error.value.what and fix in error.value.fix


def _peagle(**changes):
    from draftsync.profiles import with_changes

    return with_changes(profile("production"), "a test", method="peagle", **changes)


def test_a_peagle_plan_counts_every_depth_it_trains_a_step(config_only):
    """P-EAGLE trains all max_draft_tokens depths each step (its ttt_steps does not apply): its step is sized as an
    EAGLE-3 step of that many training-time-test steps, in memory and in time; its mask token is checked as DFlash's."""
    from draftsync.errors import DraftsyncError

    target = TargetShape.from_directory(config_only / "llama-3.1-8b")
    worker = Worker(1, 80, 256, 4000)

    def training(chosen):
        plan = plan_sync(target, worker, chosen, 1000)
        return plan, next(s for s in plan.stages if s.stage == "training")

    six, two = training(_peagle(max_draft_tokens=6)), training(_peagle(max_draft_tokens=2, gamma=2))
    eagle3_six = training(profile("production").model_copy(update={"ttt_steps": 6}))
    assert six[1].hours_estimate == pytest.approx(3 * two[1].hours_estimate)
    assert six[1].hours_estimate == pytest.approx(eagle3_six[1].hours_estimate)
    assert six[1].gpu_gib == pytest.approx(eagle3_six[1].gpu_gib, rel=1e-6)
    assert six[1].gpu_gib > two[1].gpu_gib
    assert training(_peagle(ttt_steps=1))[1].gpu_gib == six[1].gpu_gib  # ttt_steps is not P-EAGLE's
    with pytest.raises(DraftsyncError, match="mask_token_id 128256 is outside the vocabulary"):
        plan_sync(target, worker, _peagle(mask_token_id=128256), 1000)
