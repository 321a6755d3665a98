"""`bench/speedup.py --engine vllm`: speculative against plain decoding on real vLLM servers, next to the bound.

Every method vLLM serves, in one run on one machine: the drafters draftsync trains (eagle3, eagle3.1, eagle,
medusa, and draft_model: a small Llama over the target's vocabulary and tokenizer, trained on the same data at
the EAGLE-3 drafter's size, as in bench/acceptance.py) and n-gram lookup. Each method x gamma is one server
(`VllmBackend`: the launch a rollout runs), and the plain target one more, up the whole run: each speculative
server is measured right after a plain run of the same requests, its pair, which its speedup is against (so a drift
in machine load between methods moves both sides alike), and the plain runs at the start and the end show the drift
over the run (`plain_drift`). On each server the same prompts run closed-loop at batch 1 (one
request at a time) and at concurrency 4 (four clients, each sending its next request when its last is answered),
alternating, a few rounds (each figure is the median over them), as direct HTTP completions; every figure is
vLLM's own per-request one (`metrics.speculative_decoding`, `time_to_first_token_ms`, `generation_time_ms`), so
timings carry no HTTP time except tokens/s, which is the clients' wall clock.

Per method and concurrency:
- tau: tokens per decode step, (output tokens - 1) / steps, where a request's steps are its output tokens after
  the first less its accepted drafts (each step emits one token plus the drafts it accepted); vLLM's own mean
  acceptance length (1 + accepted / drafting steps) is reported beside it and differs only where a step drafted
  nothing (n-gram lookup without a match);
- c, the cost of one more draft token per step relative to a plain decode step. vLLM gives no drafter timing,
  so it is fitted: a step at gamma g takes S(g) = generation time / steps, and S(g) = V + g * d over the
  measured gammas (least squares); c = d / T and verify = V / T, T being the plain step (plain TPOT). d holds
  the drafter's step and one more verified position, which is what a longer draft costs; V is a speculative
  step's fixed cost (the verify pass and the drafting machinery), which the bound takes to be one plain step;
- the bound tau / (1 + gamma * c) (Leviathan et al.), the measured speedup (plain TPOT / spec TPOT: decode only,
  what the bound predicts) and its fraction of the bound, which is (1 + gamma c) / (verify + gamma c): what is
  missing is the speculative step's cost above a plain one. Tokens/s speedups (prompt and HTTP included) too.
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

# eagle3 first: the draft model is sized to it
TRAINED = ("eagle3", "eagle3.1", "eagle", "medusa", "draft_model")
METHODS = (*TRAINED, "ngram")
CONCURRENCY = (1, 4)
TEMPERATURES = (0.0, 1.0)
TASK = "code"
# Why the demo target by default (the JSON repeats it beside the target's size):
TARGET_CHOICE = (
    "demo: the built-in size with the most compute per token (hidden 256, 4 layers; test, deep and strong are "
    "hidden 128): vLLM's fixed cost per step on a CPU (scheduling, sampling, the engine loop) is milliseconds, and "
    "on a smaller target the forward pass, the one cost speculation saves, is a smaller share of the step; it is "
    "also the target `make demo` serves"
)
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


def run_vllm(quick: bool, size: str | None, workdir: Path, draft_sampling: str | None = None) -> dict:
    """Train (or reuse) the drafters, then measure every method x gamma on its own server (the module docstring)."""
    import torch
    from draftsync.serving.evaluation import EvalRequest
    from draftsync.serving.vllm_engine import find_vllm_engine
    from draftsync.serving.vllm_evaluation import VllmBackend
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.corpora import prompts
    from draftsync.speculative.targets import describe_target, load_target

    from acceptance import SETTINGS as ACCEPTANCE_SETTINGS
    from harness import machine_facts
    from speedup import trained_drafters

    torch.set_num_threads(1)  # training tiny drafters: one thread beats two spin-waiting ones on a busy machine
    load_at_start = round(os.getloadavg()[0], 2)
    settings = dict(SETTINGS[quick], **({"size": size} if size else {}))
    data_settings = dict(ACCEPTANCE_SETTINGS[quick], size=settings["size"], **(QUICK_TRAINING if quick else {}))
    started = time.perf_counter()
    phases: dict[str, float] = {}

    recipe = builtin_recipe(2, settings["size"])
    target_dir = build_target(recipe, workdir / "targets")
    phases["target"] = time.perf_counter() - started
    target, tokenizer = load_target(target_dir)
    drafters = trained_drafters(TRAINED, target, tokenizer, target_dir, recipe.key(), data_settings, workdir)
    del target
    phases["dataset_and_training"] = time.perf_counter() - started - phases["target"]

    requests = [  # tokenized as VllmBackend and the reference backend do
        (EvalRequest(prompt, TASK, settings["max_tokens"]), list(tokenizer(prompt)["input_ids"]))
        for prompt in prompts(TASK, settings["prompts"], seed=7)
    ]
    logs = workdir / "vllm-logs"
    # VllmBackend serves checkpoints only from the model roots: this run's own are in its work dir
    roots = os.environ.get("DRAFTSYNC_MODEL_ROOTS")
    os.environ["DRAFTSYNC_MODEL_ROOTS"] = f"{roots},{workdir}" if roots else str(workdir)
    measuring = time.perf_counter()

    engine = find_vllm_engine()
    # sampled speculation is measured only where the engine verifies sampled drafts soundly (not vLLM's CPU build)
    fault = engine.sampled_speculation_fault()
    temperatures = tuple(t for t in TEMPERATURES if t == 0 or fault is None)
    skipped = {f"T{t:g}": fault for t in TEMPERATURES if t not in temperatures}
    if draft_sampling == "probabilistic":  # greedy requests draft the argmax whatever the setting: nothing new at T=0
        temperatures = tuple(t for t in temperatures if t > 0)
        skipped["T0"] = "drafts are the argmax at T=0 whatever draft_sampling says: a run without it measures T=0"
    # The plain server stays up the whole run: each speculative server is measured right after a plain run of the
    # same requests (its pair), so a drift in the machine's load between methods moves both sides alike.
    plain_backend = VllmBackend(target_dir, log_dir=logs, engine=engine)
    spec_runs: dict[str, dict[int, dict]] = {}
    paired_plain: dict[str, dict[int, dict]] = {}
    speculative_configs: dict[str, dict] = {}
    starts = 0
    try:
        plain_runs = measure_server(plain_backend, 0, requests, settings["rounds"], temperatures)
        print("plain target measured", file=sys.stderr)
        for method in METHODS:
            drafter_dir = drafters[method][0] if method in drafters else None
            sampling = draft_sampling if drafter_dir is not None else None  # ngram drafts from the prompt
            backend = VllmBackend(target_dir, drafter_dir, method, log_dir=logs, engine=engine, draft_sampling=sampling)
            spec_runs[method], paired_plain[method] = {}, {}
            try:
                for gamma in settings["gammas"]:
                    backend.server(gamma)  # started before its pair is measured, so the pair is just before it
                    paired_plain[method][gamma] = measure_server(
                        plain_backend, 0, requests, settings["rounds"], temperatures
                    )
                    spec_runs[method][gamma] = measure_server(
                        backend, gamma, requests, settings["rounds"], temperatures
                    )
                speculative_configs[method] = {g: backend.launch(g, 0).speculative_config for g in settings["gammas"]}
            finally:
                backend.close()
            starts += backend.starts
            print(f"{method} measured at gammas {settings['gammas']}", file=sys.stderr)
        plain_again = measure_server(plain_backend, 0, requests, settings["rounds"], temperatures)  # drift over the run
    finally:
        plain_backend.close()
    starts += plain_backend.starts
    phases["measurement"] = time.perf_counter() - measuring

    by_temperature = {
        f"T{t:g}": temperature_figures(t, plain_runs, plain_again, spec_runs, paired_plain) for t in temperatures
    }
    target_facts = describe_target(target_dir)
    return {
        "benchmark": "speedup",
        "engine": "vllm",
        "quick": quick,
        "task": TASK,
        # as in bench/acceptance.py: the lowest temperature whose plain outputs do not loop
        "headline_temperature": next((t for t, block in by_temperature.items() if not block["looping"]), None),
        "method_of_c": "c = d / T from the least-squares fit S(g) = V + g d of the step time at each gamma "
        "(generation time / decode steps); verify = V / T, T the plain step (plain TPOT)",
        **by_temperature,
        "draft_sampling": draft_sampling or "greedy (vLLM's default)",
        "temperatures_not_measured": skipped,
        "sizes": {
            "target_size": settings["size"],
            **({"why": TARGET_CHOICE} if settings["size"] == "demo" else {}),
            "target_parameters": target_facts["parameter_count"],
            "target_layers": target_facts["num_layers"],
            "target_hidden_size": target_facts["hidden_size"],
            "target_vocab_size": target_facts["vocab_size"],
            "drafter_own_parameters": {m: d[1]["own_parameters"] for m, d in drafters.items()},
            "draft_model_shape": {
                key: json.loads((drafters["draft_model"][0] / "config.json").read_text())[key]
                for key in ("hidden_size", "num_hidden_layers", "intermediate_size")
            },
            "prompts": settings["prompts"],
            "max_tokens": settings["max_tokens"],
            "gammas": list(settings["gammas"]),
            "rounds": settings["rounds"],
        },
        "training": {m: {**d[1], "cached": d[2]} for m, d in drafters.items()},
        "speculative_configs": speculative_configs,
        "vllm": {
            "version": engine.version(),
            "device": engine.device,
            "server_starts": starts,
        },
        "machine": machine_facts(load_at_start, ("torch", "transformers")),
        "seconds": {
            **{name: round(value, 1) for name, value in phases.items()},
            "total": round(time.perf_counter() - started, 1),
        },
    }
