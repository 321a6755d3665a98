"""`bench/speedup.py --engine vllm`: speculative against plain decoding on real vLLM servers, next to the bound.

Every method vLLM serves, in one run on one machine: the drafters draftsync trains (eagle3, eagle3.1, eagle,
medusa, the block drafter dflash and any other method draftsync.speculative.methods registers as trained, such as
peagle once it is there; and draft_model: a small Llama over the target's vocabulary and tokenizer, trained on the
same data at the EAGLE-3 drafter's size, as in bench/acceptance.py) and n-gram lookup. `--methods` picks some.

On two targets (`--target demo|weight-bound|both`): the demo target (demo size, v2), and the weight-bound one,
demo-v2 padded to about 319 MB with work that changes nothing it computes (bench/padded_target.py), so its decode
step is bound by reading its weights, as a large target's is, while its outputs, and so the drafters, are the demo
target's: the drafters are trained once, on the demo target, and serve both.

Each method x gamma is one server (`VllmBackend`: the launch a rollout runs), and the plain target one more, up the
whole run of its target: each speculative server is measured right after a plain run of the same requests, its
pair, which its speedup is against (so a drift in machine load between methods moves both sides alike), and the
plain runs at the start and the end show the drift over the run (`plain_drift`). A drafter that drafts a bounded
block (Medusa's heads, DFlash's block) is measured only at the gammas within its bound. On each server the same
prompts run closed-loop at batch 1 (one request at a time) and at concurrency 4 (four clients, each sending its
next request when its last is answered), alternating, a few rounds (each figure is the median over them), as direct
HTTP completions; every figure is vLLM's own per-request one (`metrics.speculative_decoding`,
`time_to_first_token_ms`, `generation_time_ms`), so timings carry no HTTP time except tokens/s, which is the
clients' wall clock.

Per method and concurrency:
- tau: tokens per decode step, (output tokens - 1) / steps, where a request's steps are its output tokens after
  the first less its accepted drafts (each step emits one token plus the drafts it accepted); vLLM's own mean
  acceptance length (1 + accepted / drafting steps) is reported beside it and differs only where a step drafted
  nothing (n-gram lookup without a match);
- c, the cost of one more draft token per step relative to a plain decode step. vLLM gives no drafter timing,
  so it is fitted: a step at gamma g takes S(g) = generation time / steps, and S(g) = V + g * d over the
  measured gammas (least squares); c = d / T and verify = V / T, T being the plain step (plain TPOT). d holds
  the drafter's step and one more verified position, which is what a longer draft costs; V is a speculative
  step's fixed cost (the verify pass and the drafting machinery), which the bound takes to be one plain step.
  A block drafter drafts every position in one pass, so its d is mostly the verified position;
- the bound tau / (1 + gamma * c) (Leviathan et al.), the measured speedup (plain TPOT / spec TPOT: decode only,
  what the bound predicts) and its fraction of the bound, which is (1 + gamma c) / (verify + gamma c): what is
  missing is the speculative step's cost above a plain one. Tokens/s speedups (prompt and HTTP included) too.
`comparison` holds one row per target, temperature, concurrency and method, at the method's fastest gamma.
The prompts run at T=0 and at T=1: greedy output of a tiny target loops, which inflates acceptance, so each
temperature reports the distinct-4-gram share of the plain outputs, and `headline_temperature` names the lowest
whose outputs clear acceptance.NOT_LOOPING (as bench/acceptance.py picks its headline). T=1 is measured only on
an engine that verifies sampled drafts soundly: vLLM's CPU build does with the fix `make vllm` installs
(`VllmEngine.sampled_speculation_fault`); without it the JSON says why under `temperatures_not_measured` and only
T=0 runs. Drafters draft as vLLM does by default (the argmax, accepted with the target's probability of it);
`--draft-sampling probabilistic` has them sample their drafts and vLLM test the probability ratio (standard
speculative sampling, as the reference engine does), which changes nothing at T=0, so only T=1 runs then.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from draftsync.errors import DraftsyncError

CONCURRENCY = (1, 4)
TEMPERATURES = (0.0, 1.0)
TASK = "code"
TARGETS = ("demo", "weight-bound")
# Why each target (the JSON repeats it beside the target's size):
TARGET_CHOICE = {
    "demo": "the built-in size with the most compute per token (hidden 256, 4 layers; test, deep and strong are "
    "hidden 128): vLLM's fixed cost per step on a CPU (scheduling, sampling, the engine loop) is milliseconds, and "
    "on a smaller target the forward pass, the one cost speculation saves, is a smaller share of the step; it is "
    "also the target `make demo` serves",
    "weight-bound": "the demo target padded with work that changes nothing it computes (bench/padded_target.py): "
    "hundreds of MB of weights, which no CPU cache holds, so a decode step is bound by reading them and verifying "
    "gamma + 1 tokens costs about one step, as on a large target; its outputs are the demo target's, so the "
    "demo target's drafters serve it untrained",
}
# Two gammas at least: c is a slope.
SETTINGS = {
    True: dict(size="demo", gammas=(2, 4), prompts=4, max_tokens=48, rounds=2),
    False: dict(size="demo", gammas=(2, 4, 6), prompts=8, max_tokens=96, rounds=3),
}
# quick: a smaller dataset and shorter training than bench/acceptance.py's quick mode (five drafters to train)
QUICK_TRAINING = dict(texts=200, generated=80, generated_tokens=48, steps=150)


def run_figures(results, wall_seconds: float) -> dict:
    """One closed-loop run's figures from vLLM's per-request counts and timings (the module docstring)."""
    decoding = [r for r in results if r.output_tokens > 1]
    decode_tokens = sum(r.output_tokens - 1 for r in decoding)
    decode_seconds = sum(r.seconds - r.ttft_s for r in decoding)
    accepted = sum(r.accepted for r in decoding)
    drafts = sum(r.drafts for r in decoding)
    steps = decode_tokens - accepted
    return {
        "tokens_per_s": sum(r.output_tokens for r in results) / wall_seconds,
        "tpot_ms": 1000.0 * decode_seconds / decode_tokens,
        "step_ms": 1000.0 * decode_seconds / steps,
        "tau": decode_tokens / steps,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "median_ttft_ms": 1000.0 * statistics.median(r.ttft_s for r in results),
    }


def median_figures(runs: list[tuple[list, float]]) -> dict:
    """Each figure's median over the rounds of (results, wall seconds): a burst of load on a shared machine
    moves one round, not the median."""
    per_round = [run_figures(results, wall) for results, wall in runs]
    return {key: statistics.median(figures[key] for figures in per_round) for key in per_round[0]}


def step_cost_fit(step_ms: dict[int, float], plain_step_ms: float) -> tuple[float, float]:
    """(c, verify): the least-squares line S(g) = V + g d through the step times, as d / T and V / T."""
    if len(step_ms) < 2:
        raise DraftsyncError(
            f"step times at gammas {sorted(step_ms)} cannot give a drafter's step cost, which is a slope",
            "measure two gammas at least",
        )
    gammas, times = list(step_ms), list(step_ms.values())
    slope, intercept = statistics.linear_regression(gammas, times)
    return slope / plain_step_ms, intercept / plain_step_ms


def bound(tau: float, gamma: int, c: float) -> float:
    """Leviathan et al.'s speedup bound: tau tokens per step, each step one target pass and gamma drafter steps."""
    return tau / (1.0 + gamma * c)


def closed_loop(backend, requests: list[tuple], clients: int, gamma: int, temperature: float) -> tuple[list, float]:
    """`clients` clients, each sending its next request to `backend`'s running server as soon as its last one is
    answered, until all are done.

    `requests` are (EvalRequest, prompt token ids); returns the `RequestResult`s in request order and the wall
    seconds of the whole run."""
    import httpx
    from draftsync.serving.vllm_evaluation import REQUEST_TIMEOUT_S, request_result

    url = backend.server(gamma).url
    pending = iter(enumerate(requests))
    lock = threading.Lock()
    results: list = [None] * len(requests)

    def client() -> None:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as http:
            while True:
                with lock:
                    item = next(pending, None)
                if item is None:
                    return
                index, (request, ids) = item
                body = backend.complete(ids, request.max_tokens, temperature, index, http=http)
                results[index] = request_result(index, request, len(ids), body, gamma, url)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    return results, time.perf_counter() - started


def measure_server(backend, gamma: int, requests: list[tuple], rounds: int, temperatures: tuple) -> dict:
    """Start (or reuse) the backend's server for `gamma` and run the requests `rounds` times at each temperature and
    concurrency, these alternating: {(temperature, clients): [(results, wall seconds) per round]}."""
    runs: dict[tuple[float, int], list] = {(t, clients): [] for t in temperatures for clients in CONCURRENCY}
    for _ in range(rounds):
        for temperature, clients in runs:
            runs[temperature, clients].append(closed_loop(backend, requests, clients, gamma, temperature))
    return runs


def method_figures(
    spec: dict[int, dict], plain: dict[int, dict], spec_outputs: dict[int, list], plain_outputs: list
) -> dict:
    """One method at one concurrency: the fit, and per gamma its figures against the plain run paired with it (made
    just before it on the plain server, which stays up) and the bound."""
    plain_step = statistics.fmean(p["step_ms"] for p in plain.values())
    c, verify = step_cost_fit({g: f["step_ms"] for g, f in spec.items()}, plain_step)
    rows = []
    for gamma, figures in spec.items():
        speedup = plain[gamma]["tpot_ms"] / figures["tpot_ms"]
        limit = bound(figures["tau"], gamma, c)
        identical = sum(a == b for a, b in zip(spec_outputs[gamma], plain_outputs, strict=True))
        rows.append(
            {
                "gamma": gamma,
                **{key: round(value, 4) for key, value in figures.items()},
                "paired_plain_tpot_ms": round(plain[gamma]["tpot_ms"], 4),
                "speedup": round(speedup, 4),
                "speedup_tokens_per_s": round(figures["tokens_per_s"] / plain[gamma]["tokens_per_s"], 4),
                "bound": round(limit, 4),
                "fraction_of_bound": round(speedup / limit, 4),
                "outputs_identical_to_plain": round(identical / len(plain_outputs), 4),
            }
        )
    best = max(rows, key=lambda row: (row["speedup"], -row["gamma"]))
    return {"c": round(c, 4), "verify": round(verify, 4), "best_gamma": best["gamma"], "gammas": rows}


def temperature_figures(
    temperature: float, plain_runs: dict, plain_again: dict, spec_runs: dict, paired_plain: dict
) -> dict:
    """Everything measured at one temperature: the plain target's figures and drift, the distinct-4-gram share of
    its outputs at batch 1, each method per concurrency, and the headline (each method at its fastest gamma)."""
    from acceptance import NOT_LOOPING, distinct_4gram_share

    out: dict = {}
    for clients in CONCURRENCY:
        key = (temperature, clients)
        plain = median_figures(plain_runs[key])
        plain_outputs = [r.token_ids for r in plain_runs[key][0][0]]
        if clients == 1:
            out["distinct_4gram_share"] = round(distinct_4gram_share(plain_outputs), 4)
            out["looping"] = out["distinct_4gram_share"] < NOT_LOOPING
        out.setdefault("plain", {})[f"concurrency_{clients}"] = {
            **{k: round(v, 4) for k, v in plain.items() if k in ("tokens_per_s", "tpot_ms", "median_ttft_ms")},
            "plain_drift": round(median_figures(plain_again[key])["tokens_per_s"] / plain["tokens_per_s"], 4),
        }
        out[f"concurrency_{clients}"] = {
            method: method_figures(
                {gamma: median_figures(runs[key]) for gamma, runs in per_gamma.items()},
                {gamma: median_figures(runs[key]) for gamma, runs in paired_plain[method].items()},
                {gamma: [r.token_ids for r in runs[key][0][0]] for gamma, runs in per_gamma.items()},
                plain_outputs,
            )
            for method, per_gamma in spec_runs.items()
        }
    out["headline"] = {method: headline(out, method) for method in spec_runs}
    return out


def headline(figures_at_temperature: dict, method: str) -> dict:
    """The method at its fastest gamma at batch 1, beside its fastest at concurrency 4."""
    at_1 = figures_at_temperature["concurrency_1"][method]
    row = next(r for r in at_1["gammas"] if r["gamma"] == at_1["best_gamma"])
    at_4 = figures_at_temperature["concurrency_4"][method]
    row_4 = next(r for r in at_4["gammas"] if r["gamma"] == at_4["best_gamma"])
    return {
        "gamma": row["gamma"],
        "tau": row["tau"],
        "c": at_1["c"],
        "verify": at_1["verify"],
        "bound": row["bound"],
        "speedup": row["speedup"],
        "fraction_of_bound": row["fraction_of_bound"],
        "concurrency_4": {
            "c": at_4["c"],
            **{key: row_4[key] for key in ("gamma", "tau", "speedup", "bound", "fraction_of_bound")},
        },
    }


def methods_to_measure(requested: tuple[str, ...] | None = None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the drafters to train, the methods to measure): every trained method draftsync registers (a new one, such as
    peagle, joins when it is registered), the draft model and n-gram lookup, or those `requested`. EAGLE-3 is
    trained first whenever the draft model is, which is sized to it."""
    from draftsync.speculative.methods import METHODS as KNOWN
    from draftsync.speculative.methods import TRAINED_METHODS

    every = (*TRAINED_METHODS, "draft_model", "ngram")
    unknown = [m for m in requested or () if m not in every]
    if unknown:
        raise DraftsyncError(f"methods {unknown} are not ones this benchmark measures", f"use {', '.join(every)}")
    measured = every if requested is None else tuple(m for m in every if m in requested)
    trained = [m for m in measured if KNOWN[m].needs_checkpoint]
    if "draft_model" in trained and "eagle3" not in trained:
        trained.insert(0, "eagle3")
    trained.sort(key=lambda m: m != "eagle3")  # eagle3 first: the draft model is sized to it
    return tuple(trained), measured


def measure_target(
    target_dir: Path,
    drafters: dict,
    methods: tuple[str, ...],
    requests: list[tuple],
    settings: dict,
    temperatures: tuple,
    engine,
    logs: Path,
    draft_sampling: str | None,
) -> dict:
    """Every method on one target: the plain server up the whole time, each method x gamma paired with a plain run
    made just before it (the module docstring). A method whose server fails is named under `not_measured` and the
    run goes on: the others' figures are still worth the hours."""
    from draftsync.serving.vllm_evaluation import VllmBackend

    plain_backend = VllmBackend(target_dir, log_dir=logs, engine=engine)
    spec_runs: dict[str, dict[int, dict]] = {}
    paired_plain: dict[str, dict[int, dict]] = {}
    speculative_configs: dict[str, dict] = {}
    gammas_used: dict[str, list[int]] = {}
    not_measured: dict[str, str] = {}
    starts = 0
    try:
        plain_runs = measure_server(plain_backend, 0, requests, settings["rounds"], temperatures)
        print(f"plain {target_dir.name} measured", file=sys.stderr)
        for method in methods:
            drafter_dir = drafters[method][0] if method in drafters else None
            sampling = draft_sampling if drafter_dir is not None else None  # ngram drafts from the prompt
            backend = VllmBackend(target_dir, drafter_dir, method, log_dir=logs, engine=engine, draft_sampling=sampling)
            # a block drafter drafts at most its block (DFlash) or heads (Medusa): gammas past it are not served
            gammas = [g for g in settings["gammas"] if g <= backend.max_gamma]
            if len(gammas) < 2:
                not_measured[method] = (
                    f"drafts at most {backend.max_gamma} tokens: fewer than two of gammas {list(settings['gammas'])}, "
                    "and c is a slope"
                )
                continue
            runs: dict[int, dict] = {}
            pairs: dict[int, dict] = {}
            try:
                for gamma in gammas:
                    backend.server(gamma)  # started before its pair is measured, so the pair is just before it
                    pairs[gamma] = measure_server(plain_backend, 0, requests, settings["rounds"], temperatures)
                    runs[gamma] = measure_server(backend, gamma, requests, settings["rounds"], temperatures)
                speculative_configs[method] = {g: backend.launch(g, 0).speculative_config for g in gammas}
            except DraftsyncError as exc:
                not_measured[method] = f"{exc}"
                print(f"{method} not measured on {target_dir.name}: {exc}", file=sys.stderr)
                continue
            finally:
                backend.close()
                starts += backend.starts
            spec_runs[method], paired_plain[method], gammas_used[method] = runs, pairs, gammas
            print(f"{method} measured on {target_dir.name} at gammas {gammas}", file=sys.stderr)
        plain_again = measure_server(plain_backend, 0, requests, settings["rounds"], temperatures)  # drift over the run
    finally:
        plain_backend.close()
    starts += plain_backend.starts
    by_temperature = {
        f"T{t:g}": temperature_figures(t, plain_runs, plain_again, spec_runs, paired_plain) if spec_runs else {}
        for t in temperatures
    }
    return {
        # as in bench/acceptance.py: the lowest temperature whose plain outputs do not loop
        "headline_temperature": next(
            (t for t, block in by_temperature.items() if block and not block["looping"]), None
        ),
        **by_temperature,
        "gammas": gammas_used,
        "not_measured": not_measured,
        "speculative_configs": speculative_configs,
        "server_starts": starts,
    }


def comparison_rows(targets: dict) -> list[dict]:
    """One row per target, temperature, concurrency and method, at the method's fastest gamma there."""
    rows = []
    for name, block in targets.items():
        for temperature in (k for k in block if k.startswith("T") and block[k]):
            for clients in CONCURRENCY:
                for method, figures in block[temperature][f"concurrency_{clients}"].items():
                    row = next(r for r in figures["gammas"] if r["gamma"] == figures["best_gamma"])
                    rows.append(
                        {
                            "target": name,
                            "temperature": temperature,
                            "concurrency": clients,
                            "method": method,
                            "gamma": row["gamma"],
                            "tau": row["tau"],
                            "c": figures["c"],
                            "bound": row["bound"],
                            "speedup": row["speedup"],
                            "fraction_of_bound": row["fraction_of_bound"],
                        }
                    )
    return rows


def comparison_markdown(out: dict) -> str:
    """The comparison as docs/BENCHMARKS.md opens with it: a table per target, a method's rows together."""
    header = [
        "| method | T | concurrency | gamma | tau | c | bound | speedup | fraction of bound |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    parts = []
    for name, block in out["targets"].items():
        rows = [r for r in out["comparison"] if r["target"] == name]
        methods = list(dict.fromkeys(r["method"] for r in rows))
        rows.sort(key=lambda r: (methods.index(r["method"]), r["temperature"], r["concurrency"]))
        lines = [f"**{block['label']}**", "", *header]
        for row in rows:
            lines.append(
                f"| {row['method']} | {row['temperature'][1:]} | {row['concurrency']} | {row['gamma']} | "
                f"{row['tau']:.2f} | {row['c']:.3f} | {row['bound']:.2f} | {row['speedup']:.2f}x | "
                f"{row['fraction_of_bound']:.2f} |"
            )
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def run_vllm(
    quick: bool,
    size: str | None,
    workdir: Path,
    draft_sampling: str | None = None,
    targets: tuple[str, ...] = ("demo",),
    methods: tuple[str, ...] | None = None,
    overrides: dict | None = None,
) -> dict:
    """Train (or reuse) the drafters on the demo target, then measure every method x gamma on its own server, on
    each of `targets` (the module docstring). `overrides` replaces settings (gammas, prompts, rounds)."""
    import torch
    from draftsync.serving.evaluation import EvalRequest
    from draftsync.serving.vllm_engine import find_vllm_engine
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.corpora import prompts
    from draftsync.speculative.targets import describe_target, load_target

    from acceptance import SETTINGS as ACCEPTANCE_SETTINGS
    from harness import machine_facts
    from padded_target import WEIGHT_BOUND, build_padded_target, label, weight_bytes
    from speedup import trained_drafters

    torch.set_num_threads(1)  # training tiny drafters: one thread beats two spin-waiting ones on a busy machine
    load_at_start = round(os.getloadavg()[0], 2)
    settings = {**SETTINGS[quick], **({"size": size} if size else {}), **(overrides or {})}
    if "weight-bound" in targets and settings["size"] != WEIGHT_BOUND.size:
        raise DraftsyncError(
            f"the weight-bound target pads the {WEIGHT_BOUND.size} target, whose drafters it serves, not the "
            f"{settings['size']} one",
            f"measure the weight-bound target with --size {WEIGHT_BOUND.size} (the default)",
        )
    trained, measured = methods_to_measure(methods)
    data_settings = dict(ACCEPTANCE_SETTINGS[quick], size=settings["size"], **(QUICK_TRAINING if quick else {}))
    started = time.perf_counter()
    phases: dict[str, float] = {}

    recipe = builtin_recipe(2, settings["size"])
    target_dirs: dict[str, Path] = {}
    labels: dict[str, str] = {}
    if "demo" in targets:
        target_dirs["demo"] = build_target(recipe, workdir / "targets")
        labels["demo"] = f"{settings['size']}-v2 ({weight_bytes(target_dirs['demo']) / 1e6:.0f} MB)"
    base_dir = build_target(recipe, workdir / "targets")
    if "weight-bound" in targets:
        target_dirs["weight-bound"] = build_padded_target(WEIGHT_BOUND, workdir / "targets")
        labels["weight-bound"] = label(WEIGHT_BOUND, target_dirs["weight-bound"])
    phases["targets"] = time.perf_counter() - started
    target, tokenizer = load_target(base_dir)
    failed: dict[str, str] = {}
    drafters = trained_drafters(trained, target, tokenizer, base_dir, recipe.key(), data_settings, workdir, failed)
    del target
    phases["dataset_and_training"] = time.perf_counter() - started - phases["targets"]

    requests = [  # tokenized as VllmBackend and the reference backend do
        (EvalRequest(prompt, TASK, settings["max_tokens"]), list(tokenizer(prompt)["input_ids"]))
        for prompt in prompts(TASK, settings["prompts"], seed=7)
    ]
    logs = workdir / "vllm-logs"
    # VllmBackend serves checkpoints only from the model roots: this run's own are in its work dir
    roots = os.environ.get("DRAFTSYNC_MODEL_ROOTS")
    os.environ["DRAFTSYNC_MODEL_ROOTS"] = f"{roots},{workdir}" if roots else str(workdir)

    engine = find_vllm_engine()
    # sampled speculation is measured only where the engine verifies sampled drafts soundly (not vLLM's CPU build)
    fault = engine.sampled_speculation_fault()
    temperatures = tuple(t for t in TEMPERATURES if t == 0 or fault is None)
    skipped = {f"T{t:g}": fault for t in TEMPERATURES if t not in temperatures}
    if draft_sampling == "probabilistic":  # greedy requests draft the argmax whatever the setting: nothing new at T=0
        temperatures = tuple(t for t in temperatures if t > 0)
        skipped["T0"] = "drafts are the argmax at T=0 whatever draft_sampling says: a run without it measures T=0"
    to_measure = tuple(m for m in measured if m not in failed)
    blocks: dict[str, dict] = {}
    for name, target_dir in target_dirs.items():
        measuring = time.perf_counter()
        block = measure_target(
            target_dir, drafters, to_measure, requests, settings, temperatures, engine, logs, draft_sampling
        )
        facts = describe_target(target_dir)
        config = json.loads((target_dir / "config.json").read_text())
        blocks[name] = {
            "label": labels[name],
            "why": TARGET_CHOICE[name] if settings["size"] == "demo" else None,
            "sizes": {
                "target_parameters": facts["parameter_count"],
                "target_weight_bytes": weight_bytes(target_dir),
                "target_layers": facts["num_layers"],
                "target_hidden_size": facts["hidden_size"],
                "target_intermediate_size": config["intermediate_size"],
                "target_vocab_size": facts["vocab_size"],
            },
            **block,
            "seconds": round(time.perf_counter() - measuring, 1),
        }
        phases[f"measurement_{name}"] = time.perf_counter() - measuring
    out = {
        "benchmark": "speedup",
        "engine": "vllm",
        "quick": quick,
        "task": TASK,
        "method_of_c": "c = d / T from the least-squares fit S(g) = V + g d of the step time at each gamma "
        "(generation time / decode steps); verify = V / T, T the plain step (plain TPOT)",
        "methods": list(to_measure),
        "methods_not_trained": failed,
        "draft_sampling": draft_sampling or "greedy (vLLM's default)",
        "temperatures_not_measured": skipped,
        "targets": blocks,
        "sizes": {
            "target_size": settings["size"],
            "drafter_own_parameters": {m: d[1]["own_parameters"] for m, d in drafters.items()},
            **(
                {
                    "draft_model_shape": {
                        key: json.loads((drafters["draft_model"][0] / "config.json").read_text())[key]
                        for key in ("hidden_size", "num_hidden_layers", "intermediate_size")
                    }
                }
                if "draft_model" in drafters
                else {}
            ),
            "prompts": settings["prompts"],
            "max_tokens": settings["max_tokens"],
            "gammas": list(settings["gammas"]),
            "rounds": settings["rounds"],
        },
        "training": {m: {**d[1], "cached": d[2]} for m, d in drafters.items()},
        "vllm": {
            "version": engine.version(),
            "device": engine.device,
            "server_starts": sum(block["server_starts"] for block in blocks.values()),
        },
        "machine": machine_facts(load_at_start, ("torch", "transformers")),
        "seconds": {
            **{name: round(value, 1) for name, value in phases.items()},
            "total": round(time.perf_counter() - started, 1),
        },
    }
    out["comparison"] = comparison_rows(blocks)
    print(comparison_markdown(out), file=sys.stderr)
    return out
