"""Peak memory of building and reading a hidden-state dataset, at N samples and at 10N samples.

The builder keeps one shard's worth of states in memory and the reader slices memory-mapped shards,
so ten times the data should cost about the same peak memory (the requirement: at most 20% more).
Each build and each read runs in its own process; its peak RSS comes from the kernel (wait4's
ru_maxrss), so nothing is sampled or missed. Prints JSON.

Usage: python bench/dataset_memory.py [--samples N] [--shard-tokens T] [--workdir DIR] [--cache-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TASK_MIX = {"code": 0.5, "math": 0.5}


def build_child(target_dir: str, samples: int, out: str, shard_tokens: int, batch_size: int) -> dict:
    import torch
    from draftsync.speculative.data.corpora import mixed_texts
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids, num_decoder_layers
    from draftsync.speculative.data.samples import teacher_forced_samples
    from draftsync.speculative.data.shard_writer import build_shards
    from draftsync.speculative.targets import load_target

    torch.set_num_threads(max(1, min(4, os.cpu_count() or 1)))
    model, tokenizer = load_target(Path(target_dir))
    source = teacher_forced_samples(tokenizer, mixed_texts(TASK_MIX, samples, seed=0))
    manifest = build_shards(
        model,
        source,
        out,
        default_aux_layer_ids(num_decoder_layers(model)),
        shard_tokens=shard_tokens,
        batch_size=batch_size,
    )
    return {
        "tokens": manifest["total_tokens"],
        "sequences": manifest["num_sequences"],
        "shards": len(manifest["shards"]),
    }


def read_child(out: str, batch_size: int, seq_len: int) -> dict:
    """One pass over every training window in step order, as a trainer would stream them."""
    from draftsync.speculative.data.shard_reader import ShardDataset

    data = ShardDataset(out)
    train, _ = data.split(0.05, seed=0)
    windows = data.windows(train, seq_len)
    steps = max(1, windows.shape[0] // batch_size)
    checksum = 0.0
    for step in range(steps):
        batch = data.batch_for_step(step, batch_size, seq_len, 0, windows)
        checksum += float(batch.final[:, 0, 0].sum())
    data.token_counts()
    return {"windows": int(windows.shape[0]), "steps": steps, "checksum": round(checksum, 3)}


def measured(args: list[str]) -> tuple[dict, float, float]:
    """Run this script as a child; (its JSON result, its peak RSS in MiB, seconds)."""
    started = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, __file__, *args],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={"HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_OFFLINE": "1", **os.environ, "PYTHONPATH": str(ROOT)},
    )
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"child {args[:2]} failed with exit code {child.returncode}")
    return json.loads(output), usage.ru_maxrss / 1024, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=200, help="N: the small set; the large set is 10N")
    parser.add_argument("--shard-tokens", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=96)
    parser.add_argument("--workdir", default=".draftsync/bench-dataset")
    parser.add_argument("--cache-dir", default=None, help="built-in target cache (default: WORKDIR/cache)")
    parser.add_argument("--keep", action="store_true", help="keep the built datasets")
    parser.add_argument("--child", choices=["build", "read"], help=argparse.SUPPRESS)
    parser.add_argument("--target", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child == "build":
        print(json.dumps(build_child(args.target, args.samples, args.out, args.shard_tokens, args.batch_size)))
        return
    if args.child == "read":
        print(json.dumps(read_child(args.out, args.batch_size, args.seq_len)))
        return

    from draftsync.speculative.builtin.targets import build_target, builtin_recipe

    workdir = Path(args.workdir).resolve()
    cache_dir = Path(args.cache_dir).resolve() if args.cache_dir else workdir / "cache"
    target_dir = build_target(builtin_recipe(1, size="test"), cache_dir)
    report: dict = {"target": str(target_dir), "shard_tokens": args.shard_tokens, "batch_size": args.batch_size}
    for label, samples in (("small", args.samples), ("large", 10 * args.samples)):
        out = workdir / f"shards-{samples}"
        shutil.rmtree(out, ignore_errors=True)
        common = [
            "--samples",
            str(samples),
            "--out",
            str(out),
            "--shard-tokens",
            str(args.shard_tokens),
            "--batch-size",
            str(args.batch_size),
            "--seq-len",
            str(args.seq_len),
        ]
        built, build_rss, build_s = measured(["--child", "build", "--target", str(target_dir), *common])
        read, read_rss, read_s = measured(["--child", "read", *common])
        report[label] = {
            "samples": samples,
            "tokens": built["tokens"],
            "shards": built["shards"],
            "peak_rss_mb": round(max(build_rss, read_rss)),
            "seconds": round(build_s + read_s, 1),
            "build": {"peak_rss_mb": round(build_rss), "seconds": round(build_s, 1)},
            "read": {"peak_rss_mb": round(read_rss), "seconds": round(read_s, 1), "windows": read["windows"]},
            "disk_mb": round(sum(p.stat().st_size for p in out.iterdir()) / 2**20),
        }
        if not args.keep:
            shutil.rmtree(out, ignore_errors=True)
    small, large = report["small"], report["large"]
    report["ratio"] = round(large["peak_rss_mb"] / small["peak_rss_mb"], 3)
    report["ratio_build"] = round(large["build"]["peak_rss_mb"] / small["build"]["peak_rss_mb"], 3)
    report["ratio_read"] = round(large["read"]["peak_rss_mb"] / small["read"]["peak_rss_mb"], 3)
    report["within_20_percent"] = report["ratio"] <= 1.2
    from harness import emit_json  # bench/ is the script's folder, first on sys.path

    emit_json(report, None)


if __name__ == "__main__":
    main()
