"""Speculative decoding against plain decoding on the CPU reference engine (or vLLM), next to the analytic bound.

One run, one machine: an EAGLE-3 drafter is trained for the built-in target v2 (the same data and
settings as bench/acceptance.py), saved, loaded back through `ReferenceBackend`, and timed on held-out
code prompts at T=0. For gamma 2..8 each speculative run is paired with a plain run (gamma 0) made just
before it, in several rounds (the gamma order rotates per round), so a change in machine load hits both
sides of a ratio; medians over the rounds are reported. The knee is the gamma with the best median TPOT
(ties: the smaller). The headline `speedup` is spec tokens/s / plain tokens/s at the knee.

The bound is tau / (1 + gamma * c) (Leviathan et al.): tau = the measured mean acceptance length at the
knee, c = drafter step cost / target step cost. Both steps are timed directly, many times, alternating,
on a mid-generation context of a real request (median of each): the target's single-token decode step
with its KV cache (forward + greedy pick, as plain decoding runs it) and the drafter's single-token draft
step with its own KV cache (forward + greedy pick + mapping to a target id, as the EAGLE-3 chain runs it);
each cache is cropped back after a step, outside the timed region. The bound assumes verifying gamma+1
tokens costs one decode step; the verify pass (gamma+1 tokens, aux states captured) is timed as well, and
`bound_with_verify_cost` = tau / (verify / target + gamma * c) shows how much of the gap that explains.
Greedy outputs of tiny targets loop and loops inflate acceptance: the distinct-4-gram share of the plain
outputs is reported with the figures.

`--engine vllm` measures on real vLLM servers instead, every method vLLM serves (the drafters trained here, a
draft model and n-gram lookup), at batch 1 and at concurrency 4, on the demo target and (`--target both`) on a
weight-bound one with the same outputs; bench/speedup_vllm.py says how.

Usage: python bench/speedup.py [--engine reference|vllm] [--quick] [--size test|deep|demo] [--json PATH]
       [--workdir DIR] [--target demo|weight-bound|both] [--methods M,M] [--gammas G,G] [--prompts N] [--rounds N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from acceptance import MIX, build_dataset, distinct_4gram_share, quiet_offline_environment, train  # noqa: E402
from acceptance import SETTINGS as ACCEPTANCE_SETTINGS  # noqa: E402
from harness import emit_json  # noqa: E402

GAMMAS = tuple(range(2, 9))
TASK = "code"
# The deep target (8 layers) by default: there one drafter layer is a small share of the target (c ~0.2) and
# speculation pays. Measured on 2 CPU cores (full settings): demo size (4 layers, hidden 256) c 0.34, tau 2.2 at
# the knee, 0.94x (slower than plain) in 13 min; test size (4 layers, hidden 128, quick settings) c 0.37, 1.11x
# with some gammas below 1x; deep 1.33x in 7 min (quick settings: 1.77x in 4 min). Data and training budgets
# are bench/acceptance.py's for the same mode.
SETTINGS = {
    True: dict(size="deep", prompts=6, max_tokens=64, rounds=5, step_repeats=300),
    False: dict(size="deep", prompts=8, max_tokens=96, rounds=5, step_repeats=500),
}


def run_figures(results) -> dict:
    """Tokens/s (output tokens / generation seconds), TPOT and acceptance over one run's requests."""
    tokens = sum(r.output_tokens for r in results)
    seconds = sum(r.seconds for r in results)
    decode_tokens = sum(r.output_tokens - 1 for r in results if r.output_tokens > 1)
    decode_seconds = sum(r.seconds - r.ttft_s for r in results if r.output_tokens > 1)
    drafts = sum(r.drafts for r in results)
    return {
        "tokens_per_s": tokens / seconds,
        "tpot_ms": 1000.0 * decode_seconds / decode_tokens,
        "mean_acceptance_length": 1.0 + sum(r.accepted for r in results) / drafts if drafts else 1.0,
    }


def sweep(backend, requests, rounds: int) -> tuple[dict, list[list[int]]]:
    """Per gamma: each round's spec figures and the plain run just before it; and the plain outputs."""
    runs: dict[int, list[dict]] = {gamma: [] for gamma in GAMMAS}
    plain_outputs: list[list[int]] = []
    for round_index in range(rounds):
        order = GAMMAS[round_index % len(GAMMAS) :] + GAMMAS[: round_index % len(GAMMAS)]
        for gamma in order:
            plain = backend.generate(requests, 0, temperature=0.0, seed=0)
            spec = backend.generate(requests, gamma, temperature=0.0, seed=0)
            plain_outputs = [r.token_ids for r in plain]
            identical = sum(s.token_ids == p.token_ids for s, p in zip(spec, plain, strict=True))
            runs[gamma].append(
                {"plain": run_figures(plain), "spec": run_figures(spec), "identical": identical / len(requests)}
            )
        print(f"round {round_index + 1}/{rounds} done", file=sys.stderr)
    return runs, plain_outputs


def summarise(runs: dict) -> tuple[list[dict], list[float]]:
    """One row per gamma (medians over rounds) and every plain run's tokens/s."""
    rows, plain_rates = [], []
    for gamma, rounds in runs.items():
        plain_rates += [r["plain"]["tokens_per_s"] for r in rounds]
        rows.append(
            {
                "gamma": gamma,
                "tokens_per_s": round(statistics.median(r["spec"]["tokens_per_s"] for r in rounds), 1),
                "tpot_ms": round(statistics.median(r["spec"]["tpot_ms"] for r in rounds), 4),
                "mean_acceptance_length": round(
                    statistics.median(r["spec"]["mean_acceptance_length"] for r in rounds), 4
                ),
                # each round's spec tokens/s over the plain run made just before it
                "speedup": round(
                    statistics.median(r["spec"]["tokens_per_s"] / r["plain"]["tokens_per_s"] for r in rounds), 4
                ),
                "speedup_per_round": [round(r["spec"]["tokens_per_s"] / r["plain"]["tokens_per_s"], 4) for r in rounds],
                "plain_tokens_per_s": round(statistics.median(r["plain"]["tokens_per_s"] for r in rounds), 1),
                "plain_tpot_ms": round(statistics.median(r["plain"]["tpot_ms"] for r in rounds), 4),
                "outputs_identical_to_plain": round(min(r["identical"] for r in rounds), 4),
            }
        )
    return rows, plain_rates


def step_costs(target, drafter, context_ids: list[int], verify_tokens: int, repeats: int) -> dict:
    """Median seconds of the target's decode step, the drafter's draft step and the verify pass, timed here.

    The target runs `context_ids` into its KV cache, the drafter catches up on them as the EAGLE-3 chain
    does; then each step runs one more token at the next position and its cache is cropped back (untimed),
    so every repetition sees the same context. The three are timed in turn within each repetition.
    """
    import torch
    from draftsync.speculative.data.hidden_states import cache_keyword, capture, crop_kv_cache, new_kv_cache
    from draftsync.speculative.methods.eagle3.model import DrafterKVCache

    keyword = cache_keyword(target)
    layer_ids = tuple(drafter.config.aux_layer_ids)
    length = len(context_ids) - 1  # positions the target has run; the last token is the next input
    timings: dict[str, list[float]] = {"target": [], "drafter": [], "verify": []}
    with torch.no_grad():
        cache = new_kv_cache(target)
        states = capture(target, torch.tensor([context_ids[:length]]), layer_ids, cache=cache)
        drafter_cache = DrafterKVCache()
        logits, fed_back = drafter(
            torch.tensor([context_ids[1:]]), drafter.fuse(states.aux), torch.arange(length), drafter_cache
        )
        next_token = torch.tensor([[context_ids[-1]]])
        draft_token = torch.tensor([[int(drafter.to_target_ids(logits[0, -1].argmax()))]])
        verify_ids = torch.tensor([context_ids[-1:] + [int(draft_token)] * (verify_tokens - 1)])
        for repetition in range(repeats + repeats // 10):  # the first tenth warms up and is dropped
            started = time.perf_counter()
            out = target(input_ids=next_token, use_cache=True, **{keyword: cache})
            int(out.logits[0, -1].argmax())
            target_seconds = time.perf_counter() - started
            crop_kv_cache(cache, 1)

            started = time.perf_counter()
            step_logits, _ = drafter(draft_token, fed_back[:, -1:], torch.tensor([length]), drafter_cache)
            int(drafter.to_target_ids(step_logits[0, -1].argmax()))
            drafter_seconds = time.perf_counter() - started
            drafter_cache.crop(length)

            started = time.perf_counter()
            verified = capture(target, verify_ids, layer_ids, cache=cache)
            verified.logits[0].float().argmax(-1).tolist()
            verify_seconds = time.perf_counter() - started
            crop_kv_cache(cache, verify_tokens)

            if repetition >= repeats // 10:
                timings["target"].append(target_seconds)
                timings["drafter"].append(drafter_seconds)
                timings["verify"].append(verify_seconds)
    return {name: statistics.median(values) for name, values in timings.items()}


def trained_drafters(
    methods: tuple[str, ...],
    target,
    tokenizer,
    target_dir: Path,
    recipe_key: str,
    data_settings: dict,
    workdir: Path,
    failures: dict[str, str] | None = None,
) -> dict[str, tuple[Path, dict, bool]]:
    """Per method: the drafter's directory, its training record and whether it came from the cache.

    Each drafter is trained once per target recipe and data/training settings and cached in `workdir` (a quick
    and a full run share the target but not the data or the drafters); the dataset is built once, and only when
    a drafter is missing. A draft model gets the EAGLE-3 drafter's own parameter count (as in acceptance.py), so
    "eagle3" comes before "draft_model" in `methods`. With `failures`, a method whose training is refused (one
    registered before its trainer is complete) is recorded there with the reason and left out, not fatal.
    """
    from draftsync.errors import DraftsyncError
    from draftsync.speculative.methods.registry import parameter_count, save_drafter

    settings_key = hashlib.sha256(json.dumps(data_settings, sort_keys=True).encode()).hexdigest()[:8]
    architectures = list(getattr(target.config, "architectures", None) or ["LlamaForCausalLM"])
    dataset = None
    out: dict[str, tuple[Path, dict, bool]] = {}
    for method in methods:
        directory = workdir / f"drafter-{method}-{recipe_key}-{settings_key}"
        report_path = directory.with_name(directory.name + ".training.json")
        record = json.loads(report_path.read_text()) if report_path.exists() else {}
        if (directory / "config.json").exists() and "own_parameters" in record:  # older records lack the sizes
            out[method] = directory, record, True
            continue
        if dataset is None:
            dataset = build_dataset(
                target, tokenizer, MIX, data_settings, workdir / f"data-{recipe_key}-{settings_key}", seed=0
            )
        overrides = {}
        if method == "draft_model":
            overrides["draft_model_parameters"] = out["eagle3"][1]["own_parameters"]
        try:
            drafter, report = train(method, target, dataset, data_settings, **overrides)
        except (DraftsyncError, NotImplementedError) as exc:
            if failures is None:
                raise
            failures[method] = f"{type(exc).__name__}: {exc}"
            print(f"drafter {method} not trained: {exc}", file=sys.stderr)
            continue
        save_drafter(drafter, directory, str(target_dir), architectures, 5)
        counts = parameter_count(drafter)
        training = {
            "steps": report.steps,
            "seconds": round(report.seconds, 1),
            "tokens_per_s": round(report.tokens_per_s),
            "holdout_top1": round(report.top1_agreement, 4),
            "dataset_sequences": dataset.num_sequences,
            "dataset_tokens": dataset.manifest["total_tokens"],
            "parameters": counts.total,
            "own_parameters": counts.own,
        }
        report_path.write_text(json.dumps(training, indent=2) + "\n")
        out[method] = directory, training, False
        print(f"drafter {method} trained: {training}", file=sys.stderr)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="less data and training, fewer and shorter prompts (minutes)"
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--workdir", type=Path, help="where the target, data and drafters are cached (default: a temporary directory)"
    )
    parser.add_argument(
        "--size", choices=("test", "deep", "demo"), help="built-in target size (default: deep; demo on vLLM)"
    )
    parser.add_argument(
        "--engine",
        choices=("reference", "vllm"),
        default="reference",
        help="reference: the CPU reference engine (EAGLE-3); vllm: real vLLM servers, every method it serves",
    )
    parser.add_argument(
        "--draft-sampling",
        choices=("greedy", "probabilistic"),
        help="vllm: vLLM's draft_sample_method for drafters with a checkpoint (default: vLLM's own, greedy)",
    )
    parser.add_argument(
        "--target",
        choices=("demo", "weight-bound", "both"),
        help="vllm: the demo target, the weight-bound one (demo-v2 padded to about 319 MB, outputs unchanged: "
        "bench/padded_target.py), or both in one run (default: demo)",
    )
    parser.add_argument("--methods", help="vllm: comma-separated methods to measure (default: every one)")
    parser.add_argument("--gammas", help="vllm: comma-separated gammas, two at least (c is a slope)")
    parser.add_argument("--prompts", type=int, help="vllm: how many prompts (default: the mode's)")
    parser.add_argument("--rounds", type=int, help="vllm: rounds per server (default: the mode's)")
    args = parser.parse_args()
    vllm_only = {"--target": args.target, "--methods": args.methods, "--gammas": args.gammas}
    vllm_only.update({"--prompts": args.prompts, "--rounds": args.rounds})
    given = [flag for flag, value in vllm_only.items() if value is not None]
    if args.engine != "vllm" and given:
        parser.error(f"{', '.join(given)} apply to --engine vllm only")
    overrides: dict = {}
    if args.gammas:
        overrides["gammas"] = tuple(sorted({int(g) for g in args.gammas.split(",")}))
        if len(overrides["gammas"]) < 2 or min(overrides["gammas"]) < 1:
            parser.error("--gammas needs two positive gammas at least: c is the slope of the step time over gamma")
    overrides.update({key: value for key in ("prompts", "rounds") if (value := getattr(args, key)) is not None})
    quiet_offline_environment()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="draftsync-speedup-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.engine == "vllm":
        from speedup_vllm import TARGETS, run_vllm

        target = args.target or "demo"
        out = run_vllm(
            args.quick,
            args.size,
            workdir,
            args.draft_sampling,
            targets=TARGETS if target == "both" else (target,),
            methods=tuple(args.methods.split(",")) if args.methods else None,
            overrides=overrides,
        )
    else:
        out = run_reference(args.quick, args.size, workdir)
    emit_json(out, args.json, sys.stdout)


def run_reference(quick: bool, size: str | None, workdir: Path) -> dict:
    """The EAGLE-3 sweep on the reference engine and the step costs timed directly (the module docstring)."""
    import torch
    from draftsync.serving.evaluation import EvalRequest, ReferenceBackend, checkpoint_weight_bytes
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.corpora import prompts
    from draftsync.speculative.methods.registry import parameter_count
    from draftsync.speculative.targets import load_target

    torch.set_num_threads(1)  # tiny models: one thread beats two spin-waiting ones on a busy machine
    settings = dict(SETTINGS[quick], **({"size": size} if size else {}))
    data_settings = dict(ACCEPTANCE_SETTINGS[quick], size=settings["size"])
    started = time.perf_counter()
    phases: dict[str, float] = {}

    recipe = builtin_recipe(2, settings["size"])
    target_dir = build_target(recipe, workdir / "targets")
    target, tokenizer = load_target(target_dir)
    phases["target"] = time.perf_counter() - started
    drafter_dir, training, cached = trained_drafters(
        ("eagle3",), target, tokenizer, target_dir, recipe.key(), data_settings, workdir
    )["eagle3"]
    phases["dataset_and_training"] = time.perf_counter() - started - phases["target"]
    print(f"drafter {'cached' if cached else 'trained'}: {training}", file=sys.stderr)
    del target

    backend = ReferenceBackend(target_dir, drafter_dir, threads=1)
    requests = [
        EvalRequest(prompt, TASK, settings["max_tokens"]) for prompt in prompts(TASK, settings["prompts"], seed=7)
    ]
    measuring = time.perf_counter()
    runs, plain_outputs = sweep(backend, requests, settings["rounds"])
    rows, plain_rates = summarise(runs)
    knee_row = min(rows, key=lambda row: (row["tpot_ms"], row["gamma"]))
    knee = knee_row["gamma"]
    phases["sweep"] = time.perf_counter() - measuring

    # Step costs on a mid-generation context: the first request's prompt and half of its plain output.
    measuring = time.perf_counter()
    first_prompt = backend.tokenizer(requests[0].prompt)["input_ids"]
    context = first_prompt + plain_outputs[0][: settings["max_tokens"] // 2]
    costs = step_costs(backend.target, backend.drafter, context, knee + 1, settings["step_repeats"])
    phases["step_costs"] = time.perf_counter() - measuring
    backend.close()

    c = costs["drafter"] / costs["target"]
    tau = knee_row["mean_acceptance_length"]
    bound = tau / (1 + knee * c)
    bound_with_verify = tau / (costs["verify"] / costs["target"] + knee * c)
    target_parameters = sum(p.numel() for p in backend.target.parameters())
    counts = parameter_count(backend.drafter)
    out = {
        "benchmark": "speedup",
        "quick": quick,
        "task": TASK,
        "temperature": 0.0,
        "speedup": knee_row["speedup"],
        "knee": knee,
        "tau": tau,
        "c": round(c, 4),
        "bound": round(bound, 4),
        "fraction_of_bound": round(knee_row["speedup"] / bound, 4),
        "bound_with_verify_cost": round(bound_with_verify, 4),
        "fraction_of_bound_with_verify_cost": round(knee_row["speedup"] / bound_with_verify, 4),
        "spec_tokens_per_s": knee_row["tokens_per_s"],
        "plain_tokens_per_s": round(statistics.median(plain_rates), 1),
        "step_costs_ms": {
            "target_decode_step": round(1000 * costs["target"], 4),
            "drafter_step": round(1000 * costs["drafter"], 4),
            f"verify_{knee + 1}_tokens": round(1000 * costs["verify"], 4),
            "context_tokens": len(context) - 1,
            "repetitions": settings["step_repeats"],
        },
        "distinct_4gram_share_plain": round(distinct_4gram_share(plain_outputs), 4),
        "sweep": rows,
        "sizes": {
            "target_size": settings["size"],
            "target_parameters": target_parameters,
            "target_layers": int(backend.target.config.num_hidden_layers),
            "target_hidden_size": int(backend.target.config.hidden_size),
            "drafter_parameters": counts.total,
            "drafter_own_parameters": counts.own,
            "drafter_own_pct_of_target": round(100 * counts.own / target_parameters, 2),
            "drafter_weight_bytes": checkpoint_weight_bytes(drafter_dir),
            "target_weight_bytes": checkpoint_weight_bytes(target_dir),
            "prompts": settings["prompts"],
            "max_tokens": settings["max_tokens"],
            "rounds": settings["rounds"],
        },
        "training": {**training, "cached": cached},
        "seconds": {
            **{name: round(value, 1) for name, value in phases.items()},
            "total": round(time.perf_counter() - started, 1),
        },
    }
    return out


if __name__ == "__main__":
    main()
