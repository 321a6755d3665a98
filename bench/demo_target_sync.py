"""One sync of the demo's first target with the demo profile, as the demo runs it: each stage's seconds and each gate.

For comparing the sync across changes on one quiet machine: run it with each version's code first on the path
(`PYTHONPATH=<checkout> python bench/demo_target_sync.py`); it uses only the sync flow and the target registration,
which every version has. MLflow's local store, Prefect's ephemeral API and the CPU reference engine, as the demo's
sync uses them. Prints JSON: the stages, the total, the drafter's gates and whether it passed, and the bytes its
dataset wrote. `--hidden-states online` trains on states the target computes per batch instead of stored shards.

Usage: python bench/demo_target_sync.py [--hidden-states auto|offline|online] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parent))
from harness import emit_json, isolated_environment, machine_facts, stop_ephemeral_prefect  # noqa: E402


def main() -> None:
    import os

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--hidden-states", choices=("auto", "offline", "online"), default="auto")
    args = parser.parse_args()
    load_at_start = os.getloadavg()[0]
    run_dir = Path(tempfile.mkdtemp(prefix="demo-target-sync-"))
    isolated_environment(run_dir, {"MLFLOW_DISABLE_TELEMETRY": "true"})

    import draftsync
    from draftsync.tasks import context

    context.reset()
    settings = context.settings()
    try:
        from draftsync.flows.sync import sync
        from draftsync.profiles import profile
        from draftsync.speculative.builtin.targets import build_target, builtin_recipe
        from draftsync.tasks.registration import publish_target

        recipe = builtin_recipe(1)
        path = build_target(recipe, settings.cache_dir)
        version = publish_target("demo-llm", str(path), recipe.task_mix)
        started = time.perf_counter()
        chosen = profile("demo").model_copy(update={"hidden_states": args.hidden_states, "keep_dataset": True})
        result = sync("demo-llm", version, chosen, reason="benchmark")
        seconds = time.perf_counter() - started
        written = sum(f.stat().st_size for f in Path(result["dataset"]["path"]).rglob("*") if f.is_file())
    finally:
        stop_ephemeral_prefect()
    validation = result["validation"]
    emit_json(
        {
            "benchmark": "demo_target_sync",
            "code": str(Path(draftsync.__file__).resolve().parent.parent),
            "total_s": round(seconds, 1),
            "hidden_states": result["plan"]["settings"]["hidden_states"],
            "dataset_bytes": written,
            "stages_s": result["stages_s"],
            "passed": result["passed"],
            "gamma_knee": validation["gamma_knee"],
            "gates": {g["name"]: {"value": g["value"], "passed": g["passed"]} for g in validation["gates"]},
            "training": {
                k: result["training"].get(k) for k in ("steps", "tokens_per_s", "final_loss", "top1_agreement")
            },
            "machine": machine_facts(load_at_start, ("torch",)),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
