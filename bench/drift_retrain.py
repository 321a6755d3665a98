"""Two retrains of the same stale drafter after the traffic drifted: one on the declared task mix, one on the
captured traffic. Their acceptance on the drifted traffic says whether the retrain fixes what the monitor found.

The demo's target v1 (trained on code and math) is registered with a declared mix: the demo's {math} (what its
deployment served before the drift, `--declared demo`, the default) or the recipe's {code, math}; a deployment
serving it captures traffic, and its capture file holds prose prompts (the drift of the demo's phase c), written
through the router's capture code (`TrafficCapture`, as the router writes them). A first sync trains the drafter
the deployment served; then two retrains of the same target version run through the sync flow with the demo
profile: `captured_share: 0` (the declared mix, what a retrain did before) and the default 0.5 (half of the
responses answer captured prompts). Each drafter's acceptance is measured with the reference engine at T=0 and
gamma 2 on held-out prose prompts (none of them captured) and on held-out code and math prompts, per request, with
the demo's gates (mean 0.70, P50 0.70, P5 0.50) beside them.

Each retrain's own validation verdict is kept too (its gates, and its acceptance on the held-out captured slice).

Usage: python bench/drift_retrain.py [--declared demo|recipe] [--share S] [--steps N] [--captured N] [--prompts N]
       [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import emit_json, isolated_environment, machine_facts, stop_ephemeral_prefect  # noqa: E402

GAMMA = 2
MAX_TOKENS = 48
GATES = {"mean": 0.70, "p50": 0.70, "p5": 0.50}


def _acceptance(target, tokenizer, drafter_dir: Path, prompts: list[str]) -> dict:
    from draftsync.speculative.engine.decoding import SpeculativeEngine
    from draftsync.speculative.methods.registry import load_drafter
    from draftsync.stats import percentile

    engine = SpeculativeEngine(target, load_drafter(drafter_dir), GAMMA)
    rates, drafted, accepted = [], 0, 0
    for index, prompt in enumerate(prompts):
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        stats = engine.generate(ids, MAX_TOKENS, temperature=0.0, seed=1000 + index).stats
        drafted, accepted = drafted + stats.draft_tokens, accepted + stats.accepted
        if stats.draft_tokens:
            rates.append(stats.accepted / stats.draft_tokens)
    mean = accepted / drafted if drafted else 0.0
    p50, p5 = percentile(rates, 50) or 0.0, percentile(rates, 5) or 0.0
    return {
        "mean": round(mean, 3),
        "p50": round(p50, 3),
        "p5": round(p5, 3),
        "clears_demo_gates": mean >= GATES["mean"] and p50 >= GATES["p50"] and p5 >= GATES["p5"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--captured", type=int, default=200, help="prose prompts in the capture file")
    parser.add_argument("--prompts", type=int, default=12, help="held-out prompts measured per task")
    parser.add_argument("--share", type=float, default=0.5, help="captured_share of the captured-traffic retrain")
    parser.add_argument("--steps", type=int, help="the retrains' warm_start_steps (default: the demo profile's)")
    parser.add_argument("--declared", choices=("demo", "recipe"), default="demo", help="target v1's declared mix")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    run_dir = Path(tempfile.mkdtemp(prefix="drift-retrain-"))
    isolated_environment(run_dir, {"MLFLOW_DISABLE_TELEMETRY": "true"})

    from draftsync.tasks import context

    context.reset()
    settings = context.settings()
    started = time.perf_counter()
    try:
        from draftsync.cli.demo import TRAFFIC_MIX
        from draftsync.flows.sync import sync
        from draftsync.profiles import profile
        from draftsync.serving.traffic_capture import TrafficCapture
        from draftsync.speculative.builtin.targets import build_target, builtin_recipe
        from draftsync.speculative.data.corpora import prompts
        from draftsync.speculative.targets import load_target
        from draftsync.tasks.registration import publish_target
        from draftsync.tasks.serving import capture_config, configured_deployments

        recipe = builtin_recipe(1)
        path = build_target(recipe, settings.cache_dir)
        declared = TRAFFIC_MIX[1] if args.declared == "demo" else recipe.task_mix
        version = publish_target("demo-llm", str(path), declared)
        settings.root.mkdir(parents=True, exist_ok=True)
        (settings.root / "deployments.yaml").write_text(
            "deployments:\n  - name: demo-assistant\n    target_name: demo-llm\n    launch: external\n"
            "    endpoint: http://127.0.0.1:9\n    capture: {rate: 1.0, max_rows: 100000}\n"
        )
        capture = TrafficCapture(capture_config(configured_deployments()["demo-assistant"]), seed=0)
        for prompt in prompts("prose", args.captured, seed=7, split="train"):
            body = json.dumps({"model": "demo-assistant", "prompt": prompt}).encode()
            capture.offer("/v1/completions", {"X-Draftsync-Domain": "prose"}, body, 200, b"{}")
        capture.flush()
        demo = profile("demo")
        first = sync("demo-llm", version, demo, reason="benchmark: the drafter that went stale")
        results = {}
        for label, share in (("declared_mix", 0.0), ("captured_traffic", args.share)):
            context.sync_ledger().request("demo-llm", version, demo.method, source="cli", reason="stale", retrain=True)
            update = {"captured_share": share, **({"warm_start_steps": args.steps} if args.steps else {})}
            retrained = sync("demo-llm", version, demo.model_copy(update=update), reason=label)
            validation = retrained["validation"]
            results[label] = {
                "captured_prompts": retrained["dataset"]["captured"],
                "sync": retrained,
                "validation": {
                    "passed": validation["passed"],
                    "failed_gates": [g["name"] for g in validation["gates"] if not g["passed"]],
                    "declared_mix_acceptance": validation["acceptance"]["mean"],
                    "captured_holdout_acceptance": validation.get("captured_acceptance"),
                },
            }
        target, tokenizer = load_target(path)
        measured = {}
        drafters = {"stale": first, **{label: r["sync"] for label, r in results.items()}}
        for label, result in drafters.items():
            suffix = f"-g{result['generation']}" if result["generation"] else ""
            drafter_dir = settings.root / "drafters" / "demo-llm" / f"target-v{version}-{result['method']}{suffix}"
            measured[label] = {
                task: _acceptance(target, tokenizer, drafter_dir, prompts(task, args.prompts, seed=11))
                for task in ("prose", "code", "math")
            }
            if label in results:
                measured[label]["captured_prompts"] = results[label]["captured_prompts"]
                measured[label]["validation"] = results[label]["validation"]
    finally:
        stop_ephemeral_prefect()
    emit_json(
        {
            "benchmark": "drift_retrain",
            "gamma": GAMMA,
            "max_tokens": MAX_TOKENS,
            "prompts_per_task": args.prompts,
            "captured_prose_prompts": args.captured,
            "declared_mix": declared,
            "captured_share": args.share,
            "retrain_steps": args.steps or None,
            "demo_gates": GATES,
            "acceptance": measured,
            "total_s": round(time.perf_counter() - started, 1),
            "machine": machine_facts(load_at_start, ("torch",)),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
