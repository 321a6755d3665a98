"""Why a retrain's validation and serving disagree: the same pair measured both ways, one factor changed at a time.

Reads a finished demo's work dir (`draftsync demo`): its target v1, the drafter the retrain registered, the prompts
its router captured (the retrain's held-out slice, drawn as the sync draws it) and the prompts phase c2 served. Each
cell measures the pair at its served gamma and T=0 on one prompt set, at one max_tokens, on one engine (the CPU
reference engine validation ran on, or vLLM, which serves), requests ending at the target's EOS as served ones do.
The acceptance is pooled (accepted / drafted), as the scrape reads vLLM's counters.

Usage: python bench/validation_gap.py --workdir DEMO_WORKDIR [--engines reference,vllm] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import emit_json, machine_facts, stop_ephemeral_prefect  # noqa: E402


def _prompt_sets(workdir: Path, demo: dict) -> dict[str, list[str]]:
    """{name: prompts}: the retrain's held-out captured prompts, and phase c2's served requests in their order."""
    import random

    from draftsync.cli.demo import TARGET_NAME, TRAFFIC
    from draftsync.profiles import profile
    from draftsync.speculative.data.corpora import prompts
    from draftsync.tasks.serving import captured_prompts

    sync_profile = profile("demo")
    seed = sync_profile.seed + demo["retrain"]["generation"]
    captured, _ = captured_prompts(TARGET_NAME)
    # the retrain read the capture file before phase c2 added to it
    distinct = list(dict.fromkeys(captured[: demo["retrain"]["captured_rows"]]))
    random.Random(seed + 300).shuffle(distinct)
    held = distinct[: round(sync_profile.captured_holdout * len(distinct))]
    _, by_task, intervals, c2_seed, per_interval = TRAFFIC["c2"]
    pool = [p for task, n in by_task.items() for p in prompts(task, n, seed=c2_seed)]
    served = [pool[i % len(pool)] for i in range(intervals * per_interval)]
    return {"held_out_captured": held, "served_c2": served}


def _backend(engine: str, target_dir: str, drafter_dir: str, log_dir: Path):
    if engine == "reference":
        from draftsync.serving.evaluation import ReferenceBackend

        return ReferenceBackend(target_dir, drafter_dir, log_dir=log_dir, ignore_eos=False)
    from draftsync.serving.vllm_evaluation import VllmBackend

    return VllmBackend(target_dir, drafter_dir, log_dir=log_dir, ignore_eos=False)


def _cell(backend, prompt_list: list[str], gamma: int, max_tokens: int) -> dict:
    from draftsync.serving.evaluation import EvalRequest
    from draftsync.validation.checklist import summarize_acceptance

    requests = [EvalRequest(p, "prose", max_tokens) for p in prompt_list]
    results = backend.generate(requests, gamma, 0.0, 0)
    summary = summarize_acceptance(results)
    drafted = sum(r.draft_tokens for r in results)
    return {
        "requests": len(results),
        "distinct_prompts": len(set(prompt_list)),
        "max_tokens": max_tokens,
        "mean_output_tokens": round(sum(r.output_tokens for r in results) / len(results), 1),
        "draft_tokens": drafted,
        "acceptance": round(sum(r.accepted for r in results) / drafted, 4) if drafted else None,
        "acceptance_p50": round(summary.p50, 4),
        "acceptance_p5": round(summary.p5, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a finished demo's work dir")
    parser.add_argument("--engines", default="reference,vllm")
    parser.add_argument("--max-tokens", default="24,48", help="comma-separated")
    parser.add_argument("--drafter-version", type=int, help="default: the retrain's")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load = round(os.getloadavg()[0], 2)
    os.environ["DRAFTSYNC_WORKDIR"] = str(args.workdir.resolve())
    demo = json.loads((args.workdir / "demo.json").read_text())
    version = args.drafter_version or demo["retrain"]["drafter_version"]
    drafter = next(d for d in demo["drafters"] if d["version"] == version)
    from draftsync.cli.demo import TARGET_NAME
    from draftsync.tasks import context

    target_dir = str(context.registry().download(TARGET_NAME, drafter["target_version"]))
    sets = _prompt_sets(args.workdir, demo)
    cells = []
    try:
        for engine in args.engines.split(","):
            backend = _backend(engine, target_dir, drafter["path"], args.workdir / "serving")
            try:
                for max_tokens in (int(m) for m in args.max_tokens.split(",")):
                    for name, prompt_list in sets.items():
                        t = time.perf_counter()
                        cell = _cell(backend, prompt_list, drafter["gamma"], max_tokens)
                        cells.append({"engine": engine, "prompts": name, **cell})
                        print(
                            f"{engine} {name} max_tokens {max_tokens}: {cell} ({time.perf_counter() - t:.1f} s)",
                            file=sys.stderr,
                        )
            finally:
                backend.close()
    finally:
        stop_ephemeral_prefect()
    out = {
        "benchmark": "validation_gap",
        "drafter_version": version,
        "gamma": drafter["gamma"],
        "served": {p["name"]: p["acceptance_rate"] for p in demo["phases"]},
        "validation": {
            "declared_mix": demo["retrain"]["acceptance_on_declared_mix"],
            "held_out_captured": demo["retrain"]["acceptance_on_captured_holdout"],
        },
        "cells": cells,
        "machine": machine_facts(load),
    }
    emit_json(out, args.json)


if __name__ == "__main__":
    main()
