"""Data-parallel drafter training under torchrun: 2 ranks against 1 at the same global batch, on this machine's CPU.

The demo's target v1 (hidden 256, 4 layers, vocabulary 2048) writes hidden-state shards of 200 random sequences of 128
tokens; an EAGLE-3 drafter (draft vocabulary 256, two training-time-test steps) trains `--steps` steps of 16 x 128
tokens on them, through `draftsync.speculative.train.ranks` as a sync runs it, once per world size per round (the
sizes alternate, so a burst of load falls on both). Each run's loss curve, its steps per second in the training loop,
and its wall time with torchrun's start are recorded; the loss curves should agree, and the speed ratio is read
within the run. On a 2-core CPU, 2 gloo ranks of 1 thread each compete with 1 rank of 2 threads: the figure says
what data parallelism costs or gains there, not on GPUs.

Usage: python bench/data_parallel.py [--steps N] [--rounds R] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import emit_json, machine_facts  # noqa: E402


def _run(spec_file: Path, processes: int) -> dict:
    from draftsync.speculative.train.ranks import REPORT_FILE, command

    started = time.perf_counter()
    done = subprocess.run(command(spec_file, processes), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-2000:])
    wall = time.perf_counter() - started
    report = json.loads((Path(json.loads(spec_file.read_text())["out_dir"]) / REPORT_FILE).read_text())
    return {
        "steps_per_s": report["steps"] / report["seconds"],
        "wall_s": wall,
        "losses": [round(loss, 5) for loss in report["losses"]],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]

    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.samples import Sample
    from draftsync.speculative.data.shard_writer import build_shards
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.ranks import RankSpec

    runs: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as work_dir:
        work = Path(work_dir)
        recipe = builtin_recipe(1, "demo")
        target_dir = build_target(recipe, work / "targets")
        target, _ = load_target(target_dir)
        rng = random.Random(0)
        sequences = [[rng.randrange(1, recipe.vocab_size) for _ in range(128)] for _ in range(200)]
        samples = [Sample("random", s, [1] * len(s)) for s in sequences]
        build_shards(target, samples, work / "shards", (1, 2, 3), shard_tokens=8192, batch_size=32)
        del target
        config = TrainConfig(
            method="eagle3",
            draft_vocab_size=256,
            ttt_steps=2,
            steps=args.steps,
            batch_size=16,
            seq_len=128,
            precision="fp32",
            device="cpu",
        )
        for round_index in range(args.rounds):
            for processes in (1, 2) if round_index % 2 == 0 else (2, 1):
                out = work / f"run-{round_index}-{processes}"
                out.mkdir()
                spec = RankSpec(
                    target_dir=str(target_dir),
                    dataset_dir=str(work / "shards"),
                    config=asdict(config),
                    out_dir=str(out / "drafter"),
                    checkpoint_dir=None,
                    verifier_name="demo-llm",
                    verifier_architectures=["LlamaForCausalLM"],
                    speculative_tokens=2,
                )
                runs[processes].append(_run(spec.write(out / "spec.json"), processes))
                print(
                    f"round {round_index}: {processes} rank(s) {runs[processes][-1]['steps_per_s']:.2f} steps/s",
                    file=sys.stderr,
                )
    one, two = runs[1], runs[2]
    differences = [abs(a - b) / max(abs(a), 1e-9) for a, b in zip(one[0]["losses"], two[0]["losses"], strict=True)]
    result = {
        "global_batch": {"windows": config.batch_size, "seq_len": config.seq_len},
        "steps": args.steps,
        "rounds": args.rounds,
        "one_rank": {
            "steps_per_s_median": round(statistics.median(r["steps_per_s"] for r in one), 3),
            "wall_s_median": round(statistics.median(r["wall_s"] for r in one), 1),
            "losses": one[0]["losses"],
        },
        "two_ranks": {
            "steps_per_s_median": round(statistics.median(r["steps_per_s"] for r in two), 3),
            "wall_s_median": round(statistics.median(r["wall_s"] for r in two), 1),
            "losses": two[0]["losses"],
        },
        "two_over_one_steps_per_s": round(
            statistics.median(r["steps_per_s"] for r in two) / statistics.median(r["steps_per_s"] for r in one), 3
        ),
        "largest_relative_loss_difference": float(f"{max(differences):.3g}"),
        "machine": machine_facts(load, ("torch",)),
    }
    emit_json(result, args.json, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
