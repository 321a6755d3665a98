"""What each part of a drafter's training recipe buys in acceptance, measured side by side in one run.

Three parts, each on the reference engine at a fixed seed, so the figures of one run compare as ratios:
- `recipe`: the demo's own sync (its target v1, its dataset, its profile), then one axis changed at a time:
  training-time-test steps, what later steps are fed (the drafter's predicted state or the target's), the
  per-position loss weights, the learning-rate schedule and warm-up, the training data (corpus texts against
  responses the target writes itself), the draft vocabulary, the steps. Each variant is judged as the demo's
  validation judges a drafter: pooled acceptance, P50 and P5 of per-request acceptance at T=0, at gamma 2..6.
- `methods`: eagle3, eagle3.1, eagle and medusa on targets of two depths ("strong", 4 layers; "strong-deep",
  8 layers), several seeds: mean acceptance length at gamma 2..6 on code, math and prose at T=1 and T=0 with
  the distinct-4-gram share of the target's own outputs (under 0.9 they loop, and looping inflates
  acceptance); eagle3 over eagle and over medusa at gamma 5 on code, with the spread across seeds.
- `warm`: on the 8-layer target, target v1's drafter continued on v2's data for a share of the cold steps,
  against one trained cold for all of them: the validation acceptance each reaches, and the held-out curves.
- `story`: the demo story's two drafters as its syncs make them (drafter v1 cold on target v1, drafter v2
  warm-started from it on target v2, the demo profile's recipe) at several training seeds, with targets and
  drafters trained in fp32 and in bf16 (the two precisions `auto` picks on different CPUs), each judged by the
  demo's own checklist on the reference engine: sweep, knee, step-down and the acceptance gates (stress left out).

Usage: python bench/drafter_quality.py [--parts recipe,methods,warm,story] [--quick] [--json PATH] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from acceptance import distinct_4gram_share, generate_all, pooled, quiet_offline_environment
from harness import emit_json, machine_facts

GAMMAS = (2, 3, 4, 5, 6)
TASKS = ("code", "math", "prose")
ALL_MIX = {"code": 1 / 3, "math": 1 / 3, "prose": 1 / 3}
HEADLINE_GAMMA = 5

# Recipe variants: (name, SyncProfile fields, TrainConfig fields), each against the demo profile as it is.
RECIPE_VARIANTS: list[tuple[str, dict, dict]] = [
    ("demo profile", {}, {}),
    ("demo profile, training seed 1", {}, {"seed": 1}),
    ("demo profile, training seed 2", {}, {"seed": 2}),
    ("ttt 3", {"ttt_steps": 3}, {}),
    ("ttt 4", {"ttt_steps": 4}, {}),
    ("later steps fed the target's states", {}, {"ttt_feed": "target"}),
    ("position weights 0.8^k", {"position_decay": 0.8}, {}),
    ("ttt 4, weights 0.8^k", {"ttt_steps": 4, "position_decay": 0.8}, {}),
    ("lr 1e-3", {"lr": 1e-3}, {}),
    ("lr 4e-3", {"lr": 4e-3}, {}),
    ("warm-up 5%, decay to 0", {"warmup_steps": 15, "min_lr_ratio": 0.0}, {}),
    ("draft vocabulary 512", {"draft_vocab_size": 512}, {}),
    ("draft vocabulary 2048 (all)", {"draft_vocab_size": 2048}, {}),
    ("corpus texts only", {"generated_samples": 0}, {}),
    ("responses 800", {"generated_samples": 800}, {}),
    ("corpus texts 400", {"training_texts": 400}, {}),
    ("steps 450", {"train_steps": 450}, {}),
    ("teacher temperature 0.5", {}, {"teacher_temperature": 0.5}),
    ("teacher temperature 0.25", {}, {"teacher_temperature": 0.25}),
    ("teacher temperature 0.25, training seed 1", {}, {"teacher_temperature": 0.25, "seed": 1}),
    ("teacher temperature 0.25, training seed 2", {}, {"teacher_temperature": 0.25, "seed": 2}),
    ("steps 200", {"train_steps": 200}, {}),
    ("steps 200, corpus texts 400", {"train_steps": 200, "training_texts": 400}, {}),
    # vLLM's aux ids count layers run (0: the embeddings, L: the last layer's output); (1, 2, 3), the default for 4
    # layers, leaves out the last layer, whose output EAGLE-1 reads.
    ("aux layers 1, 2, 4", {"aux_layer_ids": (1, 2, 4)}, {}),
    ("aux layers 0, 2, 4", {"aux_layer_ids": (0, 2, 4)}, {}),
]
QUICK_RECIPE = ("demo profile", "ttt 3", "later steps fed the target's states", "position weights 0.8^k", "lr 4e-3")

SETTINGS = {
    True: dict(requests=16, max_tokens=48, seeds=2, method_steps=300, prompts=6, method_tokens=48),
    False: dict(requests=32, max_tokens=48, seeds=3, method_steps=600, prompts=8, method_tokens=64),
}


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def build_dataset(target_dir: Path, model, tokenizer, task_mix: dict, profile, root: Path):
    """The shards a sync builds with `profile` (corpus texts and the target's own greedy responses), cached by the
    profile's dataset key and the task mix."""
    from draftsync.speculative.data.corpora import mixed_texts, task_prompts_for_mix
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids, num_decoder_layers
    from draftsync.speculative.data.samples import concat_samples, regenerated_samples, teacher_forced_samples
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.data.shard_writer import build_shards

    mix = "-".join(f"{task}{share:.2f}" for task, share in sorted(task_mix.items()))
    out = root / f"data-{target_dir.name}-{profile.dataset_key()}-{mix}"
    if not (out / "manifest.json").exists():
        pairs = mixed_texts(task_mix, profile.training_texts, seed=profile.seed)
        sources = [teacher_forced_samples(tokenizer, pairs)]
        if profile.generated_samples:
            prompts = task_prompts_for_mix(task_mix, profile.generated_samples, seed=profile.seed + 100, split="train")
            sources.append(
                regenerated_samples(model, tokenizer, prompts, profile.generated_max_tokens, seed=profile.seed)
            )
        layers = profile.aux_layer_ids or default_aux_layer_ids(num_decoder_layers(model))
        build_shards(model, concat_samples(*sources), out, layers, store_aux=True, target_name=str(target_dir))
    return ShardDataset(out)


def acceptance(target, drafter, requests: list[list[int]], gamma: int, max_tokens: int, temperature: float) -> dict:
    """Pooled acceptance, per-request P5/P50 (as the validation checklist computes them), mean acceptance length,
    and the outputs."""
    from draftsync.speculative.engine.decoding import SpeculativeEngine
    from draftsync.stats import percentile

    generations = generate_all(SpeculativeEngine(target, drafter, gamma), requests, max_tokens, temperature)
    counts = pooled(generations)
    rates = [g.stats.acceptance_rate for g in generations if g.stats.draft_tokens]
    p50, p5 = (math.nan if p is None else round(p, 4) for p in (percentile(rates, 50), percentile(rates, 5)))
    return {
        "mean": round(counts["acceptance_rate"], 4),
        "p50": p50,
        "p5": p5,
        "mean_acceptance_length": round(counts["mean_acceptance_length"], 4),
        "outputs": [g.token_ids for g in generations],
    }


def figures(result: dict) -> dict:
    return {k: v for k, v in result.items() if k != "outputs"}


def recipe_part(settings: dict, quick: bool, only: list[str], cache: Path, root: Path) -> dict:
    """The demo's sync, one axis of its recipe changed at a time."""
    import torch
    from draftsync.profiles import profile as sync_profile
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.corpora import task_prompts_for_mix
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.training import fit_drafter

    recipe = builtin_recipe(1, "demo")
    target_dir = build_target(recipe, cache)
    target, tokenizer = load_target(target_dir)
    base = sync_profile("demo")
    requests = [
        tokenizer(p)["input_ids"] for _, p in task_prompts_for_mix(recipe.task_mix, settings["requests"], seed=11)
    ]
    gates = {"mean": base.validation.min_acceptance, "p50": base.validation.min_p50, "p5": base.validation.min_p5}
    rows = []
    for name, profile_fields, train_fields in RECIPE_VARIANTS:
        if (quick and name not in QUICK_RECIPE) or (only and name not in only):
            continue
        profile = base.model_copy(update=profile_fields)
        dataset = build_dataset(target_dir, target, tokenizer, recipe.task_mix, profile, root)
        config = TrainConfig.from_profile(profile, warm_start=False)
        for key, value in train_fields.items():
            setattr(config, key, value)
        torch.set_num_threads(2)
        started = time.perf_counter()
        drafter, report = fit_drafter(target, dataset, config)
        seconds = time.perf_counter() - started
        torch.set_num_threads(1)  # tiny models decode faster on one thread than on two spin-waiting ones
        by_gamma = {g: figures(acceptance(target, drafter, requests, g, settings["max_tokens"], 0.0)) for g in GAMMAS}
        served = by_gamma[base.gamma]
        rows.append(
            {
                "variant": name,
                "train_seconds": round(seconds, 1),
                "dataset_tokens": dataset.manifest["total_tokens"],
                "holdout_accuracy_by_position": [round(a, 4) for a in report.position_accuracy],
                f"passes_demo_gates_at_gamma{base.gamma}": all(served[k] > v for k, v in gates.items()),
                "by_gamma": by_gamma,
            }
        )
        log(f"recipe {name}: gamma {base.gamma} {served}, {seconds:.0f} s")
    baseline = rows[0]["by_gamma"]  # the first variant run: the demo profile unless --variants leaves it out
    for row in rows:
        row["mean_over_demo_profile"] = {g: round(row["by_gamma"][g]["mean"] / baseline[g]["mean"], 3) for g in GAMMAS}
    return {
        "target": "demo v1",
        "requests": len(requests),
        "max_tokens": settings["max_tokens"],
        "gates": gates,
        "served_gamma": base.gamma,
        "variants": rows,
    }


def method_profile(settings: dict):
    """The recipe the methods are compared under: the demo profile's, longer, with Medusa heads for every gamma."""
    from draftsync.profiles import profile as sync_profile

    return sync_profile("demo").model_copy(
        update={"train_steps": settings["method_steps"], "medusa_heads": max(GAMMAS), "draft_vocab_size": 512}
    )


METHOD_VARIANTS = (
    "eagle3",
    "eagle3.1",
    "eagle",
    "medusa",
    "eagle3 reading the last layer",
    "eagle3, whole vocabulary",
    "eagle3 reading the last layer, whole vocabulary",
)


def methods_part(settings: dict, sizes: list[str], methods: list[str], cache: Path, root: Path) -> dict:
    """eagle3, eagle3.1, eagle and medusa (and eagle3 variants) on targets of the given sizes, several seeds."""
    import statistics

    import torch
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.corpora import prompts
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.training import fit_drafter

    out = {}
    for size in sizes:
        target_dir = build_target(builtin_recipe(1, size), cache)
        target, tokenizer = load_target(target_dir)
        base = method_profile(settings)
        dataset = build_dataset(target_dir, target, tokenizer, ALL_MIX, base, root)
        # vLLM's default aux ids (2, L/2, L-3) stop short of the last layer, whose output EAGLE-1 reads: the "last
        # layer" variants read it as their highest state
        layers = target.config.num_hidden_layers
        last_ids = (dataset.aux_layer_ids[0], dataset.aux_layer_ids[1], layers)
        whole = {"draft_vocab_size": target.config.vocab_size}  # EAGLE-1 predicts over the whole vocabulary
        variants = {
            label: spec
            for label, spec in {
                "eagle3": ("eagle3", {}),
                "eagle3.1": ("eagle3.1", {}),
                "eagle": ("eagle", {}),
                "medusa": ("medusa", {}),
                "eagle3 reading the last layer": ("eagle3", {"aux_layer_ids": last_ids}),
                "eagle3, whole vocabulary": ("eagle3", whole),
                "eagle3 reading the last layer, whole vocabulary": ("eagle3", {"aux_layer_ids": last_ids, **whole}),
            }.items()
            if label in methods
        }
        by_task = {
            task: [tokenizer(p)["input_ids"] for p in prompts(task, settings["prompts"], seed=7)] for task in TASKS
        }
        torch.set_num_threads(1)
        text = {}
        for task, requests in by_task.items():
            for temperature in (0.0, 1.0):
                plain = acceptance(target, None, requests, 0, settings["method_tokens"], temperature)["outputs"]
                text[f"{task}@T{temperature:g}"] = round(distinct_4gram_share(plain), 3)
        results = []
        headline: dict[float, dict[str, list]] = {t: {m: [] for m in variants} for t in (1.0, 0.0)}
        for seed in range(settings["seeds"]):
            for label, (method, fields) in variants.items():
                profile = base.model_copy(update={"method": method, "seed": seed, **fields})
                data = build_dataset(target_dir, target, tokenizer, ALL_MIX, profile, root)
                torch.set_num_threads(2)
                drafter, report = fit_drafter(target, data, TrainConfig.from_profile(profile, warm_start=False))
                torch.set_num_threads(1)
                for task, requests in by_task.items():
                    for temperature in (0.0, 1.0):
                        # the whole sweep for the first seed; then the headline only (code, gamma 5)
                        gammas = GAMMAS if seed == 0 else ((HEADLINE_GAMMA,) if task == "code" else ())
                        for gamma in gammas:
                            row = figures(
                                acceptance(target, drafter, requests, gamma, settings["method_tokens"], temperature)
                            )
                            results.append(
                                {
                                    "method": label,
                                    "seed": seed,
                                    "task": task,
                                    "temperature": temperature,
                                    "gamma": gamma,
                                }
                                | row
                            )
                            if task == "code" and gamma == HEADLINE_GAMMA:
                                headline[temperature][label].append(row["mean_acceptance_length"])
                log(f"methods {size} seed {seed} {label}: holdout {report.position_accuracy}")

        def spread(values):
            return {
                "mean": round(statistics.mean(values), 4),
                "min": round(min(values), 4),
                "max": round(max(values), 4),
                "stdev": round(statistics.stdev(values), 4) if len(values) > 1 else 0.0,
            }

        def ratios(lengths: dict[str, list]) -> dict:
            return {
                f"{a}_over_{b}": spread([x / y for x, y in zip(lengths[a], lengths[b], strict=True)])
                for a in lengths
                for b in ("eagle", "medusa")
                if a.startswith("eagle3") and b in lengths
            }

        out[size] = {
            "target_layers": layers,
            "aux_layer_ids": {"default": list(dataset.aux_layer_ids), "last layer": list(last_ids)},
            "distinct_4gram_share": text,
            "headline": {
                f"T{t:g}": {
                    "what": f"mean acceptance length, code, gamma {HEADLINE_GAMMA}, T={t:g}, per seed",
                    "by_method": {m: spread(v) | {"per_seed": v} for m, v in lengths.items()},
                    "ratios": ratios(lengths),
                }
                for t, lengths in headline.items()
            },
            "results": results,
        }
    return out


def warm_part(settings: dict, cache: Path, root: Path) -> dict:
    """Target v1's drafter continued on v2's data for a share of the cold steps, against a cold drafter."""
    import torch
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.corpora import task_prompts_for_mix
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.training import fit_drafter

    profile = method_profile(settings)
    v1_dir = build_target(builtin_recipe(1, "strong-deep"), cache)
    v2_recipe = builtin_recipe(2, "strong-deep")
    v2_dir = build_target(v2_recipe, cache)
    v1, v1_tokenizer = load_target(v1_dir)
    v2, tokenizer = load_target(v2_dir)
    torch.set_num_threads(2)
    v1_data = build_dataset(v1_dir, v1, v1_tokenizer, builtin_recipe(1, "strong-deep").task_mix, profile, root)
    v2_data = build_dataset(v2_dir, v2, tokenizer, v2_recipe.task_mix, profile, root)
    previous, _ = fit_drafter(v1, v1_data, TrainConfig.from_profile(profile, warm_start=False))
    cold_steps = profile.train_steps
    every = max(1, cold_steps // 12)
    config = TrainConfig.from_profile(profile, warm_start=False)
    config.eval_every = every
    cold, cold_report = fit_drafter(v2, v2_data, config)
    requests = [
        tokenizer(p)["input_ids"] for _, p in task_prompts_for_mix(v2_recipe.task_mix, settings["requests"], 11)
    ]

    def validation(drafter) -> dict:
        torch.set_num_threads(1)
        result = figures(acceptance(v2, drafter, requests, 3, settings["max_tokens"], 0.0))
        torch.set_num_threads(2)
        return result

    def curve(report) -> list:
        points = [
            (int(r["step"]), round(r["holdout_accuracy_pos0"], 4))
            for r in report.history
            if "holdout_accuracy_pos0" in r
        ]
        return points + [(report.steps, round(report.top1_agreement, 4))]

    cold_validation = validation(cold)
    warm_runs = []
    for share in (1 / 12, 1 / 6, 1 / 3):
        steps = max(1, round(cold_steps * share))
        config = TrainConfig.from_profile(profile, warm_start=True)
        config.steps, config.eval_every = steps, max(1, steps // 4)
        warm, report = fit_drafter(v2, v2_data, config, init_from=previous)
        result = validation(warm)
        warm_runs.append(
            {
                "steps": steps,
                "share_of_cold": round(share, 3),
                "validation_gamma3_T0": result,
                "reaches_cold": result["mean"] >= cold_validation["mean"],
                "holdout_curve": curve(report),
            }
        )
        log(f"warm {steps} steps: {result} (cold {cold_validation})")
    first = next((r["steps"] for r in warm_runs if r["reaches_cold"]), None)
    return {
        "target": "strong-deep v1 -> v2",
        "cold_steps": cold_steps,
        "cold_validation_gamma3_T0": cold_validation,
        "cold_holdout_curve": curve(cold_report),
        "untrained_v1_drafter_on_v2_gamma3_T0": validation(previous),
        "warm": warm_runs,
        "warm_steps_to_reach_cold": first,
        "within_a_third": first is not None and first <= cold_steps / 3,
    }


def story_part(seeds: int, precisions: list[str], cache: Path, root: Path) -> dict:
    """The story's drafters v1 and v2 at `seeds` training seeds and each precision, judged by the demo's checklist."""
    import dataclasses

    import torch
    from draftsync.cli.demo import STALE_THRESHOLD, TRAFFIC_MIX
    from draftsync.profiles import profile as sync_profile
    from draftsync.serving.evaluation import ReferenceBackend
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.methods.registry import save_drafter
    from draftsync.speculative.targets import load_target
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.training import fit_drafter
    from draftsync.validation.runner import run_checklist

    base = sync_profile("demo")
    gates = ("validation_acceptance_mean", "acceptance_at_deployment_temperature", "acceptance_p50", "acceptance_p5")
    rows: list[dict[str, Any]] = []
    for precision in precisions:
        v1_recipe = dataclasses.replace(builtin_recipe(1, "demo"), precision=precision)
        v2_recipe = dataclasses.replace(builtin_recipe(2, "demo"), precision=precision, parent=v1_recipe)
        torch.set_num_threads(2)
        pairs = []
        for version, recipe in ((1, v1_recipe), (2, v2_recipe)):
            target_dir = build_target(recipe, cache)
            model, tokenizer = load_target(target_dir)
            task_mix = TRAFFIC_MIX.get(version, recipe.task_mix)  # what the demo registers it for
            dataset = build_dataset(target_dir, model, tokenizer, task_mix, base, root)
            pairs.append((version, task_mix, target_dir, model, dataset))
        for seed in range(seeds):
            previous = None
            for version, task_mix, target_dir, model, dataset in pairs:
                config = TrainConfig.from_profile(base, warm_start=previous is not None)
                config.seed, config.precision = seed, precision
                torch.set_num_threads(2)
                torch.manual_seed(seed)
                started = time.perf_counter()
                drafter, _ = fit_drafter(model, dataset, config, init_from=previous)
                seconds = time.perf_counter() - started
                out = save_drafter(
                    drafter,
                    root / f"story-{precision}-seed{seed}-v{version}",
                    str(target_dir),
                    list(model.config.architectures or ["LlamaForCausalLM"]),
                    base.gamma,
                )
                backend = ReferenceBackend(target_dir, out, ignore_eos=False)
                try:
                    checklist = run_checklist(
                        backend,
                        str(target_dir),
                        str(out),
                        task_mix,
                        base.validation,
                        seed=base.seed,
                        run_stress=False,
                        stale_threshold=STALE_THRESHOLD,
                    )
                finally:
                    backend.close()
                verdicts = {gate.name: gate.passed for gate in checklist.gates if gate.name in gates}
                rows.append(
                    {
                        "precision": precision,
                        "seed": seed,
                        "drafter": f"v{version}",
                        "warm_start": previous is not None,
                        "train_seconds": round(seconds, 1),
                        "gamma_fastest": checklist.gamma_fastest,
                        "gamma_served": checklist.gamma_knee,
                        "gammas_rejected": checklist.gammas_rejected,
                        "mean_t0": checklist.acceptance_greedy,
                        "p50": checklist.acceptance.p50,
                        "p5": checklist.acceptance.p5,
                        "sweep": [(r["gamma"], r["acceptance_rate"], r["tpot_ms"]) for r in checklist.gamma_sweep],
                        "passes_acceptance_gates": all(verdicts.values()),
                    }
                )
                log(f"story {precision} seed {seed} v{version}: {rows[-1]}")
                previous = drafter
    return {
        "gates": {
            "mean": base.validation.min_acceptance,
            "p50": base.validation.min_p50,
            "p5": base.validation.min_p5,
        },
        "validation_requests": base.validation.requests,
        "all_pass": all(row["passes_acceptance_gates"] for row in rows),
        "worst": {key: min(row[key] for row in rows) for key in ("mean_t0", "p50", "p5")},
        "drafters": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="recipe,methods,warm", help="comma-separated: recipe, methods, warm, story")
    parser.add_argument("--quick", action="store_true", help="fewer variants, seeds, steps and requests")
    parser.add_argument("--variants", help="recipe variants to run, by name, separated by ';' (default: all)")
    parser.add_argument(
        "--sizes", default="strong,strong-deep", help="built-in target sizes for the methods part, comma-separated"
    )
    parser.add_argument("--methods", help="the methods part's drafters, separated by ';' (default: all)")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--workdir", type=Path, help="where targets and datasets are cached (default: a temporary dir)")
    parser.add_argument("--targets", type=Path, help="where built targets are cached (default: WORKDIR/targets)")
    parser.add_argument("--seeds", type=int, default=3, help="the story part's training seeds")
    parser.add_argument("--precisions", default="fp32,bf16", help="the story part's training precisions")
    args = parser.parse_args()
    quiet_offline_environment()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = set(parts) - {"recipe", "methods", "warm", "story"}
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}: use recipe, methods, warm, story")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    if set(precisions) - {"fp32", "bf16"}:
        parser.error(f"unknown precisions {sorted(set(precisions) - {'fp32', 'bf16'})}: use fp32, bf16")
    load_at_start = round(os.getloadavg()[0], 2)
    started = time.perf_counter()
    settings = SETTINGS[args.quick]
    root = args.workdir or Path(tempfile.mkdtemp(prefix="draftsync-quality-"))
    cache = args.targets or root / "targets"
    out: dict = {"benchmark": "drafter_quality", "quick": args.quick, "settings": settings}
    only = [v.strip() for v in args.variants.split(";") if v.strip()] if args.variants else []
    runners = {"recipe": lambda: recipe_part(settings, args.quick, only, cache, root)}
    sizes = [v.strip() for v in args.sizes.split(",") if v.strip()]
    methods = [m.strip() for m in args.methods.split(";") if m.strip()] if args.methods else list(METHOD_VARIANTS)
    if set(methods) - set(METHOD_VARIANTS):
        parser.error(f"unknown methods {sorted(set(methods) - set(METHOD_VARIANTS))}: use {'; '.join(METHOD_VARIANTS)}")
    runners["methods"] = lambda: methods_part(settings, sizes, methods, cache, root)
    runners["warm"] = lambda: warm_part(settings, cache, root)
    runners["story"] = lambda: story_part(args.seeds, precisions, cache, root)
    for part in parts:
        part_started = time.perf_counter()
        out[part] = runners[part]()
        out[part]["seconds"] = round(time.perf_counter() - part_started, 1)
    out["seconds"] = round(time.perf_counter() - started, 1)
    out["machine"] = machine_facts(load_at_start, ("torch", "transformers"))
    emit_json(out, args.json, sys.stdout)


if __name__ == "__main__":
    main()
