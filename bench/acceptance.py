"""Acceptance of every drafter family on the built-in targets, against n-gram lookup and a small draft model.

One run, one machine, same data and the same training budget for every method, so the figures compare as
ratios. For each method and task (code, math, prose) at T=0 and T=1 and gamma 2..8 it measures the
acceptance rate and the mean acceptance length with the reference engine on held-out prompts. It also
reports training tokens/s, drafter size as % of the target, the distinct-4-gram share of the target's own
outputs (looping outputs inflate acceptance and favour n-gram lookup; `comparisons.headline` names the
code comparison at gamma 5 measured on outputs that do not loop), and warm vs cold start after a target
update (the previous version's drafter trained for half the steps against a cold one trained for all of
them: the steps each needs to reach 90/95/99/100% of the cold drafter's final held-out accuracy, and both
drafters' validation acceptance on every task's held-out prompts).

Usage: python bench/acceptance.py [--quick] [--size strong|test|deep|demo] [--json PATH] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

TASKS = ("code", "math", "prose")
METHODS = ("eagle3", "eagle3.1", "eagle", "medusa", "draft_model")
GAMMAS = tuple(range(2, 9))
MIX = {"code": 1 / 3, "math": 1 / 3, "prose": 1 / 3}
NOT_LOOPING = 0.9  # distinct-4-gram share of the target's outputs from which they count as not looping

SETTINGS = {
    # quick: the strong-size targets (the test shape trained 10x longer), small data, few prompts; about
    # 15 minutes on 2 CPU cores, 4 of them building the targets (cached in --workdir)
    True: dict(
        size="strong",
        texts=300,
        generated=150,
        generated_tokens=64,
        steps=300,
        prompts=6,
        max_tokens=48,
        warm_eval_every=25,
    ),
    False: dict(
        size="strong",
        texts=800,
        generated=400,
        generated_tokens=96,
        steps=600,
        prompts=12,
        max_tokens=64,
        warm_eval_every=25,
    ),
}


def quiet_offline_environment() -> None:
    """No hub access, no progress bars: a benchmark reads only what is on this machine."""
    for key, value in {
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TRANSFORMERS_VERBOSITY": "error",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }.items():
        os.environ.setdefault(key, value)


def distinct_4gram_share(outputs: list[list[int]]) -> float:
    """Distinct 4-grams / all 4-grams over the outputs: near 0 for looping text, near 1 for varied text."""
    grams = [tuple(o[i : i + 4]) for o in outputs for i in range(len(o) - 3)]
    return len(set(grams)) / len(grams) if grams else 0.0


def build_dataset(model, tokenizer, task_mix, settings, out_dir: Path, seed: int):
    from draftsync.speculative.data.corpora import mixed_texts, task_prompts_for_mix
    from draftsync.speculative.data.hidden_states import default_aux_layer_ids, num_decoder_layers
    from draftsync.speculative.data.samples import concat_samples, regenerated_samples, teacher_forced_samples
    from draftsync.speculative.data.shard_reader import ShardDataset
    from draftsync.speculative.data.shard_writer import build_shards

    pairs = mixed_texts(task_mix, settings["texts"], seed=seed)
    prompts = task_prompts_for_mix(task_mix, settings["generated"], seed=seed + 100, split="train")
    samples = concat_samples(
        teacher_forced_samples(tokenizer, pairs),
        regenerated_samples(model, tokenizer, prompts, settings["generated_tokens"], temperature=1.0, seed=seed),
    )
    build_shards(model, samples, out_dir, default_aux_layer_ids(num_decoder_layers(model)), store_aux=True)
    return ShardDataset(out_dir)


def train(method, target, dataset, settings, init_from=None, **overrides):
    from draftsync.speculative.methods import METHODS as KNOWN
    from draftsync.speculative.train.config import TrainConfig
    from draftsync.speculative.train.training import fit_drafter

    config = TrainConfig(
        method=method,
        steps=settings["steps"],
        # a reduced draft vocabulary where the method has its own head (not EAGLE-1, DFlash, the draft model)
        draft_vocab_size=None if method == "draft_model" or KNOWN[method].full_vocabulary else 512,
        batch_size=8,
        seq_len=128,
        lr=5e-3,
        ttt_steps=3,
        medusa_heads=max(GAMMAS),
        seed=0,
        **overrides,
    )
    return fit_drafter(target, dataset, config, init_from=init_from)


def generate_all(engine, tokenized_prompts, max_tokens, temperature) -> list:
    """Each prompt through the engine, seeded by its position (the same seeds in every benchmark)."""
    return [
        engine.generate(ids, max_tokens, temperature=temperature, seed=1000 + i)
        for i, ids in enumerate(tokenized_prompts)
    ]


def pooled(generations) -> dict:
    """Acceptance rate and mean acceptance length, pooled over the generations' counters."""
    drafts = sum(g.stats.drafts for g in generations)
    draft_tokens = sum(g.stats.draft_tokens for g in generations)
    accepted = sum(g.stats.accepted for g in generations)
    return {
        "acceptance_rate": accepted / draft_tokens if draft_tokens else 0.0,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
    }


def measure(engine, tokenized_prompts, max_tokens, temperature):
    """Aggregate counters over the prompts, and the outputs."""
    generations = generate_all(engine, tokenized_prompts, max_tokens, temperature)
    return pooled(generations), [g.token_ids for g in generations]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="less data, fewer steps and prompts (about 10 minutes once the targets are cached)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--workdir", type=Path, help="where targets are cached (default: a temporary directory)")
    parser.add_argument(
        "--size", choices=("test", "deep", "demo", "strong"), help="built-in target size (default: strong)"
    )
    args = parser.parse_args()
    quiet_offline_environment()

    import torch
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.corpora import prompts
    from draftsync.speculative.engine.decoding import SpeculativeEngine
    from draftsync.speculative.methods.registry import make_proposer, parameter_count
    from draftsync.speculative.targets import load_target

    torch.set_num_threads(1)  # tiny models: one thread beats two spin-waiting ones on a busy machine
    settings = dict(SETTINGS[args.quick], **({"size": args.size} if args.size else {}))
    started = time.perf_counter()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="draftsync-bench-"))
    cache = workdir / "targets"
    v1_dir = build_target(builtin_recipe(1, settings["size"]), cache)
    v2_dir = build_target(builtin_recipe(2, settings["size"]), cache)
    target, tokenizer = load_target(v2_dir)
    target_parameters = sum(p.numel() for p in target.parameters())
    dataset = build_dataset(target, tokenizer, MIX, settings, workdir / "data-v2", seed=0)

    drafters, training = {}, {}
    for method in METHODS:
        overrides = {}
        if method == "draft_model":  # the same size as the EAGLE-3 drafter, embeddings aside
            overrides["draft_model_parameters"] = parameter_count(drafters["eagle3"]).own
        drafter, report = train(method, target, dataset, settings, **overrides)
        counts = parameter_count(drafter)
        drafters[method] = drafter
        training[method] = {
            "steps": report.steps,
            "seconds": round(report.seconds, 1),
            "tokens_per_s": round(report.tokens_per_s),
            "holdout_top1": round(report.top1_agreement, 4),
            "holdout_accuracy_by_position": [round(a, 4) for a in report.position_accuracy],
            "parameters": counts.total,
            "own_parameters": counts.own,
            "own_pct_of_target": round(100 * counts.own / target_parameters, 2),
        }
        print(f"trained {method}: {training[method]}", file=sys.stderr)

    proposers = {m: make_proposer(d) for m, d in drafters.items()}
    proposers["ngram"] = make_proposer("ngram")
    results, text_quality = [], {}
    prompts_by_task = {
        task: [tokenizer(p)["input_ids"] for p in prompts(task, settings["prompts"], seed=7)] for task in TASKS
    }
    for task, tokenized in prompts_by_task.items():
        for temperature in (0.0, 1.0):
            _, plain_outputs = measure(
                SpeculativeEngine(target, None, 0), tokenized, settings["max_tokens"], temperature
            )
            text_quality[f"{task}@T{temperature:g}"] = round(distinct_4gram_share(plain_outputs), 3)
            for method, proposer in proposers.items():
                for gamma in GAMMAS:
                    figures, _ = measure(
                        SpeculativeEngine(target, proposer, gamma), tokenized, settings["max_tokens"], temperature
                    )
                    results.append(
                        {
                            "method": method,
                            "task": task,
                            "temperature": temperature,
                            "gamma": gamma,
                            **{k: round(v, 4) for k, v in figures.items()},
                        }
                    )
            print(f"measured {task} at T={temperature:g}", file=sys.stderr)

    # Warm vs cold after a target update: v1's drafter continues on v2's data for half the steps, as a
    # sync does (warm_start_steps), against a drafter trained from scratch for the full budget.
    v1_target, v1_tokenizer = load_target(v1_dir)
    v1_dataset = build_dataset(
        v1_target, v1_tokenizer, {"code": 0.5, "math": 0.5}, settings, workdir / "data-v1", seed=1
    )
    previous, _ = train("eagle3", v1_target, v1_dataset, settings)
    every = settings["warm_eval_every"]
    cold_drafter, cold = train("eagle3", target, dataset, settings, eval_every=every)
    warm_drafter, warm = train(
        "eagle3", target, dataset, {**settings, "steps": settings["steps"] // 2}, eval_every=every, init_from=previous
    )

    def curve(report):
        points = [(int(r["step"]), r["holdout_accuracy_pos0"]) for r in report.history if "holdout_accuracy_pos0" in r]
        return points + [(report.steps, report.top1_agreement)]

    def steps_to_reach(report, goal):
        return next((step for step, accuracy in curve(report) if accuracy >= goal), None)

    def pooled_acceptance(drafter, temperature):
        """Mean acceptance length at gamma 5 over every task's held-out prompts: the validation acceptance."""
        engine = SpeculativeEngine(target, make_proposer(drafter), 5)
        figures = [measure(engine, prompts_by_task[task], settings["max_tokens"], temperature)[0] for task in TASKS]
        return round(sum(f["mean_acceptance_length"] for f in figures) / len(figures), 4)

    goals = {f"{int(fraction * 100)}%": fraction * cold.top1_agreement for fraction in (0.9, 0.95, 0.99, 1.0)}
    validation = {
        f"T{t:g}": {"cold": pooled_acceptance(cold_drafter, t), "warm": pooled_acceptance(warm_drafter, t)}
        for t in (0.0, 1.0)
    }
    warm_start = {
        "cold_steps": cold.steps,
        "cold_holdout_top1": round(cold.top1_agreement, 4),
        "warm_steps": warm.steps,
        "warm_holdout_top1": round(warm.top1_agreement, 4),
        # steps each run needs to come within a share of the cold drafter's final held-out accuracy
        "steps_to_share_of_cold_accuracy": {
            share: {"cold": steps_to_reach(cold, goal), "warm": steps_to_reach(warm, goal)}
            for share, goal in goals.items()
        },
        # mean acceptance length at gamma 5 on the held-out prompts of every task, after each run's last step
        "validation_mean_acceptance_length": validation,
        "warm_reaches_cold_in_half_the_steps": warm.top1_agreement >= cold.top1_agreement
        and all(v["warm"] >= v["cold"] for v in validation.values()),
        "cold_curve": [(s, round(a, 4)) for s, a in curve(cold)],
        "warm_curve": [(s, round(a, 4)) for s, a in curve(warm)],
    }

    def mal(method, temperature, gamma=5, task="code"):
        return next(
            r["mean_acceptance_length"]
            for r in results
            if r["method"] == method and r["gamma"] == gamma and r["task"] == task and r["temperature"] == temperature
        )

    def comparison(temperature):
        share = text_quality[f"code@T{temperature:g}"]
        lengths = {m: mal(m, temperature) for m in (*METHODS, "ngram")}
        return {
            "distinct_4gram_share": share,
            "looping": share < NOT_LOOPING,
            "mean_acceptance_length": lengths,
            **{
                f"eagle3_over_{m}": round(lengths["eagle3"] / lengths[m], 3) for m in ("medusa", "ngram", "draft_model")
            },
        }

    comparisons = {f"code_gamma5_T{t:g}": comparison(t) for t in (0.0, 1.0)}
    # The headline is measured on text the target writes without looping (looping inflates acceptance and
    # favours n-gram lookup): the lowest temperature whose code outputs clear NOT_LOOPING.
    comparisons["headline"] = next((k for k, v in comparisons.items() if not v["looping"]), None)
    out = {
        "benchmark": "acceptance",
        "quick": args.quick,
        "target_size": settings["size"],
        "target_parameters": target_parameters,
        "dataset": {"sequences": dataset.num_sequences, "tokens": dataset.manifest["total_tokens"]},
        "distinct_4gram_share": text_quality,
        "training": training,
        "warm_start": warm_start,
        "comparisons": comparisons,
        "results": results,
        "seconds": round(time.perf_counter() - started, 1),
    }
    from harness import emit_json  # bench/ is the script's folder, first on sys.path

    emit_json(out, args.json)


if __name__ == "__main__":
    main()
