"""The sync's ML path on a GPU, end to end as far as one machine allows, for a machine with only torch and
transformers (and accelerate, for the target's device_map; no network, vLLM, Prefect, MLflow or pydantic).

A random Llama-3.2-1B-shaped target is saved with a tokenizer and loaded as a sync loads it (its placement, bf16 on
cuda:0); the drafter is then trained by the sync's own `fit_drafter` on stored states, resumed from a checkpoint of an
interrupted run, trained on states computed online beside the loaded target, and trained and resumed by two torchrun
ranks (gloo on a CPU; NCCL only with two GPUs). Faults of placement (a target parameter moved, a drafter sharing the
target's tensors), of resuming and of the ranks' checkpoint agreement only show here, not in the CPU tests. Each
phase reports seconds, tokens/s, peak GPU memory and losses; the offline phase adds measured against predicted step
memory. Prints JSON; exits non-zero naming the broken invariant. On a CPU, `--tiny` runs it all at toy shapes (the
test suite does, so it does not rot).

Usage: python bench/gpu_check.py [--steps 100] [--tiny] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "bench"))

# Llama-3.2-1B's widths (1.24B parameters with its tied embedding); the tiny shape keeps its proportions
FULL = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
            num_key_value_heads=8, vocab_size=128256)  # fmt: skip
TINY = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1024)  # fmt: skip
TWO_GPUS_NEEDED = "needs 2 GPUs: NCCL refuses two ranks on one GPU"


class Interrupted(Exception):
    """Stops a run after its checkpoint, as a killed sync would stop."""


@dataclass(frozen=True)
class Check:
    """One run of the check: where it works, its target and the shapes it trains at."""

    work: Path
    target_dir: Path
    device: str
    cuda: bool
    steps: int
    samples: int
    sample_tokens: int
    draft_vocab: int
    ttt: int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="steps of each training (a multiple of 2)")
    parser.add_argument("--tiny", action="store_true", help="toy shapes, on the CPU when there is no GPU")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from harness import emit_json

    emit_json(run(args.steps, args.tiny), args.json)


def run(steps: int, tiny: bool) -> dict:
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not tiny:
        raise SystemExit("no CUDA device: run on a GPU machine, or with --tiny on a CPU")
    if steps < 2 or steps % 2:
        raise SystemExit("--steps must be an even number >= 2 (checkpoints are written every steps/2)")
    if cuda and importlib.util.find_spec("accelerate") is None:
        raise SystemExit("pip install accelerate: transformers places a target by device_map only through it")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        check = Check(
            work=Path(work),
            target_dir=Path(work) / "target",
            device="cuda:0" if cuda else "cpu",
            cuda=cuda,
            steps=steps,
            samples=48 if tiny else 256,
            sample_tokens=64 if tiny else 1024,
            draft_vocab=256 if tiny else 32000,
            ttt=2 if tiny else 4,
        )
        result: dict[str, Any] = {
            "benchmark": "gpu_check",
            "device": torch.cuda.get_device_name() if cuda else "cpu",
            "torch": torch.__version__,
        }
        target, result["target"] = save_and_load_target(check, FULL if not tiny else TINY)
        result["offline"] = train_offline(check, target)
        result["resume"] = resume_interrupted(check, target)
        result["online"] = train_online(check, target)
        result["ranks"] = torchrun_ranks(check)
    result["seconds"] = round(time.perf_counter() - started, 1)
    return result


def save_and_load_target(check: Check, shape: dict) -> tuple[Any, dict]:
    """A random target saved with a tokenizer, loaded by `load_target` in the placement a sync gives it."""
    import torch
    from draftsync.speculative.builtin.tokenizer import train_tokenizer
    from draftsync.speculative.placement import TargetPlacement, from_pretrained_options
    from draftsync.speculative.target_description import read_target_config
    from draftsync.speculative.targets import load_target
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**shape, max_position_embeddings=8192, tie_word_embeddings=True)
    torch.manual_seed(0)
    with torch.device(check.device):
        model = LlamaForCausalLM(config).to(torch.bfloat16 if check.cuda else torch.float32)
    model.save_pretrained(check.target_dir)
    del model
    texts = [f"sample {i}: the drafter proposes, the target verifies, {i * 7919 % 1000} tokens" for i in range(200)]
    train_tokenizer(texts, min(512, config.vocab_size), check.target_dir)
    placement = TargetPlacement((check.device,)) if check.cuda else TargetPlacement()
    options = from_pretrained_options(read_target_config(check.target_dir), placement)
    started = time.perf_counter()
    target, _ = load_target(check.target_dir, trust_remote_code=False, load_options=options)
    return target, {
        "parameters": sum(p.numel() for p in target.parameters()),
        "dtype": str(target.dtype),
        "devices": sorted({str(p.device) for p in target.parameters()}),
        "load_seconds": round(time.perf_counter() - started, 2),
    }


def train_offline(check: Check, target: Any) -> dict:
    """Stored states written by `build_shards`, then the sync's training on them beside the target."""
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.train.step_memory import BF16, FP32, StepShape, drafter_parameters, predict_step_memory

    started = time.perf_counter()
    build_dataset(check, target, check.work / "offline")
    built = time.perf_counter() - started
    config = train_config(check, check.steps)
    figures, _ = train_checked(check, target, ShardDataset(check.work / "offline"), config, check.work / "ckpt-offline")
    width = BF16 if check.cuda else FP32
    shape = StepShape.for_target(
        target.config, check.draft_vocab, config.batch_size // 2, config.seq_len, check.ttt,
        head_bytes=width, activation_bytes=width,
    )  # fmt: skip
    predicted = predict_step_memory(shape)
    resident = predicted["target_head"] + width * drafter_parameters(shape)[1]  # held by the target already
    measured = figures["peak_beyond_target_gib"]
    beyond = (predicted["total"] - resident) / 2**30
    return {
        **figures,
        "states_tokens_per_s": round(check.samples * check.sample_tokens / built),
        "predicted_step_gib": round(predicted["total"] / 2**30, 3),
        "predicted_parts_gib": {k: round(v / 2**30, 3) for k, v in predicted.items() if k != "total"},
        "predicted_beyond_target_gib": round(beyond, 3),
        "predicted_over_measured": None if not measured else round(beyond / measured, 3),
    }


def resume_interrupted(check: Check, target: Any) -> dict:
    """A run of 2N steps stopped after its checkpoint at step N, then started again: it must resume from N. Its
    checkpoint at N is kept for the torchrun ranks to resume too."""
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.train.training import fit_drafter

    config = train_config(check, 2 * check.steps)
    checkpoints = check.work / "ckpt-resume"

    def stop_after_checkpoint(step: int, total: int, metrics: dict) -> None:
        if step > check.steps:  # called before step N+1's checkpoint, after step N's
            raise Interrupted

    try:
        fit_drafter(target, ShardDataset(check.work / "offline"), config, None, checkpoints, stop_after_checkpoint)
    except Interrupted:
        pass
    else:
        fail(f"the run of {config.steps} steps was not interrupted after step {check.steps}")
    shutil.copytree(checkpoints, check.work / "ckpt-ranks-resume")
    figures, report = train_checked(check, target, ShardDataset(check.work / "offline"), config, checkpoints)
    if report.resumed_from_step != check.steps or report.steps != config.steps:
        fail(f"the resumed run started at step {report.resumed_from_step} (not {check.steps}), ran to {report.steps}")
    return {**figures, "resumed_from_step": report.resumed_from_step}


def train_online(check: Check, target: Any) -> dict:
    """A dataset of tokens only, whose states the loaded target computes as training reads each batch."""
    from draftsync.speculative.data.online_states import open_dataset

    build_dataset(check, target, check.work / "online", online=True)
    dataset = open_dataset(check.work / "online", target)
    if dataset.stores_states:
        fail("build_shards(online=True) wrote states")
    figures, _ = train_checked(check, target, dataset, train_config(check, check.steps), check.work / "ckpt-online")
    return figures


def torchrun_ranks(check: Check) -> dict:
    """Two ranks under torchrun, as a data-parallel sync trains: from scratch, then resuming the interrupted run's
    checkpoint with its remaining steps (every rank must accept a checkpoint its own device did not write)."""
    import torch

    if check.cuda and torch.cuda.device_count() < 2:
        return {"skipped": TWO_GPUS_NEEDED}
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    fresh = launch_ranks(check, "ranks-fresh", train_config(check, check.steps), check.work / "ckpt-ranks")
    resumed = launch_ranks(
        check, "ranks-resume", train_config(check, 2 * check.steps), check.work / "ckpt-ranks-resume"
    )
    if fresh["world_size"] != 2 or resumed["world_size"] != 2:
        fail(f"torchrun trained on {fresh['world_size']} and {resumed['world_size']} ranks, not 2")
    if resumed["resumed_from_step"] != check.steps or resumed["steps"] != 2 * check.steps:
        fail(f"the ranks resumed from step {resumed['resumed_from_step']}, not the checkpoint's {check.steps}")
    return {"world_size": 2, "fresh": fresh, "resumed": resumed}


def launch_ranks(check: Check, name: str, config: Any, checkpoints: Path) -> dict:
    from draftsync.errors import DraftsyncError
    from draftsync.speculative.train.ranks import REPORT_FILE, RankSpec, launch

    out = check.work / name
    out.mkdir()
    spec = RankSpec(
        target_dir=str(check.target_dir),
        dataset_dir=str(check.work / "offline"),
        config=asdict(config),
        out_dir=str(out),
        checkpoint_dir=str(checkpoints),
        verifier_name=str(check.target_dir),
        verifier_architectures=["LlamaForCausalLM"],
        speculative_tokens=check.ttt,
    ).write(check.work / f"{name}.json")
    started = time.perf_counter()
    try:
        launch(spec, 2, out / "torchrun.log")
    except DraftsyncError as error:
        lines = (out / "torchrun.log").read_text().splitlines()
        first = next((i for i, line in enumerate(lines) if "Traceback" in line), len(lines) - 40)
        fail(f"{error}\n" + "\n".join(lines[max(0, first) : first + 40]))  # the first rank's traceback
    seconds = time.perf_counter() - started
    report = json.loads((out / REPORT_FILE).read_text())
    trained = report["steps"] - report["resumed_from_step"]
    return {
        "seconds": round(seconds, 1),  # torchrun's start and each rank's imports and target load included
        "steps": report["steps"],
        "world_size": report["world_size"],
        "resumed_from_step": report["resumed_from_step"],
        "resumed_world_size": report["resumed_world_size"],
        "tokens_per_s": round(report["tokens_per_s"]) if trained else None,
        "peak_memory_gib": None,  # held by the ranks' own processes
        "loss_first": round(report["losses"][0], 4),
        "loss_last": round(report["final_loss"], 4),
    }


def build_dataset(check: Check, target: Any, out_dir: Path, online: bool = False) -> None:
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids
    from draftsync.speculative.data.shard_writer import build_shards

    samples = random_samples(check.samples, check.sample_tokens, target.config.vocab_size)
    layers = default_aux_layer_ids(target.config.num_hidden_layers)
    build_shards(target, samples, out_dir, layers, target_name=str(check.target_dir), online=online)


def train_config(check: Check, steps: int) -> Any:
    """What a sync trains with on this target, on its device; two micro-batches a step, so accumulation runs."""
    from draftsync.speculative.train.config import TrainConfig

    windows = 16 if check.cuda else 8
    return TrainConfig(
        method="eagle3",
        draft_vocab_size=check.draft_vocab,
        steps=steps,
        batch_size=windows,
        seq_len=check.sample_tokens,
        batch_tokens=windows // 2 * check.sample_tokens,
        lr=3e-4 if check.cuda else 3e-3,
        warmup_steps=min(10, check.steps // 2),
        ttt_steps=check.ttt,
        checkpoint_every=check.steps // 2,
        device=check.device,
        precision="bf16" if check.cuda else "fp32",
    )


def train_checked(check: Check, target: Any, dataset: Any, config: Any, checkpoints: Path) -> tuple[dict, Any]:
    """`fit_drafter` beside the loaded target, its figures, and the invariants a sync relies on: every target
    parameter stays where it was placed, and the drafter handed back shares no tensor with the target."""
    import torch
    from draftsync.speculative.train.training import fit_drafter

    placed = {name: p.device for name, p in target.named_parameters()}
    before = 0
    if check.cuda:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    drafter, report = fit_drafter(target, dataset, config, checkpoint_dir=checkpoints)
    peak = torch.cuda.max_memory_allocated() if check.cuda else None
    moved = [name for name, p in target.named_parameters() if p.device != placed[name]]
    if moved:
        fail(f"training moved {len(moved)} target parameters off their device, e.g. {moved[:3]}")
    shared = storages(drafter) & storages(target)
    if shared:
        fail(f"the trained drafter shares {len(shared)} tensors with the target")
    if not all(math.isfinite(loss) for loss in report.losses):
        fail(f"training on {dataset.path} gave a non-finite loss")
    return {
        "seconds": round(report.seconds, 2),
        "steps": report.steps,
        "tokens_per_s": round(report.tokens_per_s),
        "peak_memory_gib": None if peak is None else round(peak / 2**30, 3),
        "peak_beyond_target_gib": None if peak is None else round((peak - before) / 2**30, 3),
        "loss_first": round(report.losses[0], 4),
        "loss_last": round(report.final_loss, 4),
        "top1_agreement": round(report.top1_agreement, 4),
        "target_stays_placed": True,
        "drafter_owns_its_tensors": True,
    }, report


def storages(module: Any) -> set[int]:
    tensors = [*module.parameters(), *module.buffers()]
    return {t.untyped_storage().data_ptr() for t in tensors if t.device.type != "meta" and t.numel()}


def random_samples(count: int, length: int, vocab: int) -> list:
    """Uniform random token ids: the drafter learns the random target's distribution over them."""
    import torch
    from draftsync.speculative.data.samples import Sample

    ids = torch.randint(0, vocab, (count, length), generator=torch.Generator().manual_seed(0))
    return [Sample(task="random", input_ids=row, loss_mask=[1] * length) for row in ids.tolist()]


def fail(message: str) -> None:
    raise SystemExit(f"gpu-check failed: {message}")


if __name__ == "__main__":
    main()
