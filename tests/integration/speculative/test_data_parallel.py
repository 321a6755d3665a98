"""Data-parallel training under real torchrun processes (gloo on the CPU): 2 ranks take the steps 1 rank takes at the
same global batch, whether each holds the whole drafter (DDP) or half of it (FSDP2), and a run stopped on 2 ranks
resumes on 1 with the uninterrupted run's losses."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from draftsync.errors import DraftsyncError
from draftsync.speculative.train.checkpoints import CHECKPOINT_FILE
from draftsync.speculative.train.config import TrainConfig
from draftsync.speculative.train.data_parallel import Ranks
from draftsync.speculative.train.ranks import REPORT_FILE, RankSpec, command
from draftsync.speculative.train.training import fit_drafter

pytestmark = pytest.mark.slow

CONFIG = TrainConfig(
    method="eagle3",
    draft_vocab_size=128,
    steps=12,
    batch_size=8,
    seq_len=32,
    lr=3e-3,
    warmup_steps=2,
    precision="fp32",
    device="cpu",
    seed=0,
)


@pytest.fixture(scope="module")
def dataset_dir(built_targets, tmp_path_factory) -> Path:
    """The test target's hidden states over 64 random token walks of 40 tokens."""
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids
    from draftsync.speculative.data.samples import Sample
    from draftsync.speculative.data.shard_writer import build_shards
    from draftsync.speculative.targets import load_target

    target, _ = load_target(built_targets[1])
    generator = torch.Generator().manual_seed(3)
    vocab = target.config.vocab_size
    samples = [
        Sample("chat", torch.randint(1, vocab, (40,), generator=generator).tolist(), [1] * 40) for _ in range(64)
    ]
    out = tmp_path_factory.mktemp("dp-shards")
    aux = default_aux_layer_ids(target.config.num_hidden_layers)
    build_shards(target, samples, out, aux, shard_tokens=4096, batch_size=16)
    return out


def _spec(built_targets, dataset_dir, out: Path, config: TrainConfig, checkpoints: Path | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    spec = RankSpec(
        target_dir=str(built_targets[1]),
        dataset_dir=str(dataset_dir),
        config=asdict(config),
        out_dir=str(out / "drafter"),
        checkpoint_dir=str(checkpoints) if checkpoints else None,
        verifier_name="test-target",
        verifier_architectures=["LlamaForCausalLM"],
        speculative_tokens=2,
    )
    return spec.write(out / "spec.json")


def _train(spec_file: Path, processes: int) -> dict:
    done = subprocess.run(command(spec_file, processes), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((Path(json.loads(spec_file.read_text())["out_dir"]) / REPORT_FILE).read_text())


@pytest.mark.parametrize("replica", ["ddp", "fsdp"])
def test_two_ranks_take_the_steps_one_rank_takes_at_the_same_global_batch(
    built_targets, dataset_dir, tmp_path, replica
):
    one = _train(_spec(built_targets, dataset_dir, tmp_path / "one", CONFIG), 1)
    config = TrainConfig(**{**asdict(CONFIG), "data_parallel": replica})
    two = _train(_spec(built_targets, dataset_dir, tmp_path / "two", config), 2)
    assert (one["world_size"], two["world_size"]) == (1, 2)
    assert one["tokens"] == two["tokens"] > 0  # every window of every step trained once, on one rank or the other
    assert len(one["losses"]) == len(two["losses"]) == CONFIG.steps
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-4), (one["losses"], two["losses"])
    assert two["position_accuracy"] == pytest.approx(one["position_accuracy"], abs=1e-6)
    assert one["losses"][-1] < one["losses"][0]  # it learnt: the comparison is not of two untrained runs
    share = two["trainable_held"] / one["trainable_held"]  # FSDP2 keeps half of the weights (and so of AdamW) a rank
    assert share == 1.0 if replica == "ddp" else 0.45 < share <= 0.55, share


@pytest.mark.system  # make test-system
def test_a_run_stopped_on_two_ranks_resumes_on_one_with_the_uninterrupted_losses(built_targets, dataset_dir, tmp_path):
    """Stopped while its ranks hold half of the drafter each (FSDP2), resumed by one process holding all of it."""
    config = TrainConfig(**{**asdict(CONFIG), "steps": 100, "checkpoint_every": 5, "data_parallel": "fsdp"})
    checkpoints = tmp_path / "checkpoints"
    first = subprocess.Popen(
        command(_spec(built_targets, dataset_dir, tmp_path / "stopped", config, checkpoints), 2),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = checkpoints / CHECKPOINT_FILE
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGTERM)  # the job preempted: torchrun stops its ranks before it exits
    first.wait(timeout=120)
    stopped_at = torch.load(checkpoint, weights_only=False)["step"]
    assert 0 < stopped_at < config.steps

    one_process = TrainConfig(**{**asdict(config), "data_parallel": "ddp"})  # the same run: the fingerprint agrees
    resumed = _train(_spec(built_targets, dataset_dir, tmp_path / "resumed", one_process, checkpoints), 1)
    assert (resumed["resumed_from_step"], resumed["resumed_world_size"]) == (stopped_at, 2)
    whole = _train(_spec(built_targets, dataset_dir, tmp_path / "whole", one_process), 1)
    assert resumed["losses"] == pytest.approx(whole["losses"], rel=1e-4)


def test_a_batch_the_ranks_cannot_share_is_refused_naming_both_sizes(built_targets, dataset_dir):
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.targets import load_target

    target, _ = load_target(built_targets[1])
    config = TrainConfig(**{**asdict(CONFIG), "batch_size": 2})
    with pytest.raises(DraftsyncError, match="a batch of 2 windows cannot be shared by 4 training processes"):
        fit_drafter(target, ShardDataset(dataset_dir), config, ranks=Ranks(rank=0, world_size=4))


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.system  # make test-system
def test_two_nodes_meet_at_a_c10d_rendezvous_and_take_the_steps_one_rank_takes(built_targets, dataset_dir, tmp_path):
    """Two torchrun launches on loopback stand for two machines of one rank each, as every node runs the same spec."""
    from concurrent.futures import ThreadPoolExecutor

    from draftsync.speculative.train.ranks import launch

    spec = _spec(built_targets, dataset_dir, tmp_path / "nodes", CONFIG)
    endpoint = f"127.0.0.1:{_free_port()}"
    with ThreadPoolExecutor(2) as nodes:
        joined = [nodes.submit(launch, spec, 1, tmp_path / f"node-{n}.log", 2, endpoint, 120) for n in range(2)]
        for node in joined:
            node.result(timeout=600)
    two = json.loads((tmp_path / "nodes" / "drafter" / REPORT_FILE).read_text())
    one = _train(_spec(built_targets, dataset_dir, tmp_path / "one", CONFIG), 1)
    assert two["world_size"] == 2 and two["losses"] == pytest.approx(one["losses"], rel=1e-4)


def test_a_node_missing_from_the_rendezvous_fails_in_the_join_timeout_naming_the_endpoint(
    built_targets, dataset_dir, tmp_path
):
    from draftsync.speculative.train.ranks import launch

    spec = _spec(built_targets, dataset_dir, tmp_path / "alone", CONFIG)
    endpoint = f"127.0.0.1:{_free_port()}"
    started = time.monotonic()
    with pytest.raises(DraftsyncError, match=f"did not all join the rendezvous at {endpoint} within 5 s"):
        launch(spec, 1, tmp_path / "alone.log", 2, endpoint, 5)
    assert time.monotonic() - started < 120  # the join timeout and torchrun's own start, not torchrun's default


def test_a_rendezvous_that_cannot_be_reached_is_named_within_the_timeout():
    from draftsync.speculative.train.ranks import wait_for_rendezvous

    started = time.monotonic()
    with pytest.raises(DraftsyncError, match="rendezvous at 192.0.2.1:29400 could not be reached within 2 s"):
        wait_for_rendezvous("192.0.2.1:29400", 2)  # TEST-NET-1: never routed to any machine
    assert time.monotonic() - started < 10
    with pytest.raises(DraftsyncError, match="is not HOST:PORT"):
        wait_for_rendezvous("node-0", 2)
