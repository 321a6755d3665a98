"""Training step time in fp32 against bf16 autocast on this machine's CPU: the demo's target and its EAGLE-3 drafter.

`precision: auto` trains under bf16 autocast on a CPU only where its own small probe measured bf16 faster (AVX512-BF16
alone is not enough: 1.52x on one such machine, 0.66x on another); this is the full measurement, with the probe's
answer beside it. Each model trains `--steps` steps per precision after two warm-up steps, the two
precisions alternating in rounds so that a burst of load on a shared machine falls on both; the figure is the
median seconds per step, and the ratio fp32 / bf16 is read within the run.
- target: the demo-size built-in Llama (hidden 256, 4 layers, vocabulary 2048), batch 16 x 128 tokens, AdamW;
- drafter: an EAGLE-3 drafter of that target (draft vocabulary 256, two training-time-test steps), batch 8 x 128,
  from hidden-state shards of 200 random sequences.
Both use the code paths the product trains with (`build_target`'s loss and `fit_drafter`).

Usage: python bench/train_precision.py [--steps N] [--rounds R] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import emit_json, machine_facts  # noqa: E402


def _target_steps(model, batch, steps: int, bf16: bool) -> float:
    import contextlib

    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    times = []
    for step in range(steps + 2):
        started = time.perf_counter()
        with autocast:
            loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step >= 2:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def _drafter_seconds(target, dataset, steps: int, precision: str) -> float:
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.training import fit_drafter

    config = TrainConfig(
        method="eagle3", steps=steps, draft_vocab_size=256, batch_size=8, seq_len=128, ttt_steps=2, precision=precision
    )
    started = time.perf_counter()
    fit_drafter(target, dataset, config)
    return (time.perf_counter() - started) / steps


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]

    import torch
    from draftsync.speculative.builtin.targets import builtin_recipe, family_config
    from draftsync.speculative.data.samples import Sample
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.data.shard_writer import build_shards
    from draftsync.speculative.machine import cpu_bf16_speedup, trains_in_bf16
    from transformers import AutoModelForCausalLM

    recipe = builtin_recipe(1, "demo")
    torch.manual_seed(0)
    target = AutoModelForCausalLM.from_config(family_config(recipe, eos_token_id=0))
    frozen = AutoModelForCausalLM.from_config(family_config(recipe, eos_token_id=0)).eval()  # the drafter's target
    batch = torch.randint(0, recipe.vocab_size, (recipe.batch_size, recipe.seq_len))
    rng = random.Random(0)
    sequences = [[rng.randrange(recipe.vocab_size) for _ in range(128)] for _ in range(200)]
    with tempfile.TemporaryDirectory() as work:
        samples = [Sample("random", s, [1] * len(s)) for s in sequences]
        build_shards(frozen, samples, Path(work) / "shards", (1, 2, 3), shard_tokens=8192, batch_size=32)
        dataset = ShardDataset(Path(work) / "shards")
        seconds: dict[str, dict[str, list[float]]] = {"target": {}, "drafter": {}}
        for _ in range(args.rounds):
            for precision in ("fp32", "bf16"):
                target.train()
                seconds["target"].setdefault(precision, []).append(
                    _target_steps(target, batch, args.steps, precision == "bf16")
                )
                seconds["drafter"].setdefault(precision, []).append(
                    _drafter_seconds(frozen, dataset, args.steps, precision)
                )
    result = {
        "native_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        # What `precision: auto` decided from its own small probe on this CPU (draftsync/speculative/machine.py).
        "auto_probe_fp32_over_bf16": cpu_bf16_speedup(),
        "auto_trains_in_bf16": trains_in_bf16("auto", torch.device("cpu")),
        "threads": torch.get_num_threads(),
        "steps_per_round": args.steps,
        "rounds": args.rounds,
    }
    for model, by_precision in seconds.items():
        fp32, bf16 = statistics.median(by_precision["fp32"]), statistics.median(by_precision["bf16"])
        result[model] = {
            "fp32_s_per_step": round(fp32, 4),
            "bf16_s_per_step": round(bf16, 4),
            "fp32_over_bf16": round(fp32 / bf16, 3),
        }
    result["machine"] = machine_facts(load, ("torch", "transformers"))
    emit_json(result, args.json, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
