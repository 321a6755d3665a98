"""The validation checklist and pre-rollout benchmarks a drafter must pass before it may serve, run through an
evaluation backend. Prefect-free, so the checklist runs and is tested without a flow: the task in
tasks/validation.py picks the backend and the stress runner and passes its run logger in.

The production guide's checklist, each item a named gate with its measured value, threshold and verdict:

| gate | measures |
|---|---|
| data_coverage | failed data expectations of the training set (task mix, no empty or non-finite samples) |
| validation_acceptance_mean | pooled acceptance at T=0 over the validation set |
| acceptance_at_deployment_temperature | the same at the deployment's sampling temperature |
| acceptance_p50, acceptance_p5 | percentiles of per-request acceptance at the deployment's temperature |
| tpot_speedup | TPOT without / with speculation on the same requests, at the knee |
| stress_speedup, stress_errors | the same under stress_factor x QPS with concurrency, against served instances |
| long_output_acceptance | acceptance on the longest outputs the profile asks for, run on their own |
| fallback_equivalence | greedy outputs with speculation off equal those with it on (the fallback is safe) |
| drafter_memory_overhead | drafter weight bytes / target weight bytes |

A target's own MTP head has no data_coverage gate: no draftsync dataset trained it (a refresh learns the target's own
greedy answers).

The gamma sweep runs first; its knee (best measured TPOT among the gammas whose acceptance rate clears the
acceptance gate by more than its sampling error, ties to the smaller gamma) is the gamma every other
measurement uses and the one recorded as the drafter's baseline. The sweep judges a few requests' pooled rate;
when the whole validation set at the knee then fails an acceptance gate (mean, P50, P5), validation steps down to
the next smaller swept gamma and measures the set again, so the served gamma is the fastest one found to clear
every acceptance gate; the gammas stepped down from are reported (`gammas_rejected`). The sweep stops at what the
drafter proposes (a Medusa drafter: its heads), so the knee is a gamma it can be served at. Stress per batch size gives
vLLM's per-batch-size schedule, except for methods vLLM serves without one (`unscheduled_reason`: Medusa, the block
drafters), whose result says why it has none.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.profiles import ValidationProfile
from draftsync.serving.evaluation import (
    SERVED_NAME,
    EvalRequest,
    EvaluationBackend,
    RequestResult,
    checkpoint_weight_bytes,
)
from draftsync.serving.traffic_capture import CAPTURED_TASK, CapturedPrompt
from draftsync.validation.checklist import (
    AcceptanceSummary,
    Gate,
    acceptance_by_length,
    acceptance_rate_lower_bound,
    gamma_knee,
    identical_outputs_share,
    pooled_tpot_ms,
    summarize_acceptance,
)
from draftsync.validation.result import (
    AcceptanceFigures,
    ChecklistResult,
    DraftSamplingChoice,
    DraftSamplingFigures,
    MemoryFootprint,
    Prediction,
    RequestCounts,
    TpotMs,
    knee_reason,
)
from draftsync.validation.stress import StressLoad, schedule_check, stress_comparison

GREEDY_CHECK_REQUESTS = 8  # at T>0 the equivalence check reruns this many requests greedily
# vLLM's draft_sample_method values, its default first: a tie goes to it (no draft probabilities held in memory).
DRAFT_SAMPLINGS = ("greedy", "probabilistic")
NOT_AT_T0 = (
    "does not apply at T=0: drafts are the drafter's argmax and are kept only where they are the target's argmax, "
    "whichever method; measured once"
)


def validation_requests(task_mix: dict[str, float], count: int, max_tokens: int, seed: int) -> list[EvalRequest]:
    """Held-out prompts in the proportions of the task mix, shuffled so any prefix is a fair sample."""
    from draftsync.speculative.data.corpora import task_prompts_for_mix

    pairs = task_prompts_for_mix(task_mix, count, seed=seed)
    random.Random(seed).shuffle(pairs)
    return [EvalRequest(prompt, task_name, max_tokens) for task_name, prompt in pairs[:count]]


def _context_length(target_dir: str) -> int:
    config = json.loads((Path(target_dir) / "config.json").read_text())
    return int(config.get("max_position_embeddings") or config.get("max_seq_len") or 2048)


def _sweep_gammas(backend: EvaluationBackend, profile: ValidationProfile) -> list[int]:
    low, high = profile.gamma_range
    gammas = [g for g in range(low, high + 1) if g <= backend.max_gamma]
    if not gammas:
        raise DraftsyncError(
            f"this drafter proposes at most {backend.max_gamma} tokens, below the sweep {low}..{high}",
            "lower the profile's gamma_range or give the drafter more heads",
        )
    return gammas


def _sweep_row(gamma: int, results: list[RequestResult]) -> dict:
    summary = summarize_acceptance(results)
    return {
        "gamma": gamma,
        "mean_acceptance_length": round(summary.mean_acceptance_length, 4),
        "acceptance_rate": round(summary.mean, 4),
        "acceptance_rate_lower": round(acceptance_rate_lower_bound(results), 4),
        "tpot_ms": round(pooled_tpot_ms(results), 4),
    }


def _sweep(
    backend: EvaluationBackend, requests: list[EvalRequest], profile: ValidationProfile, seed: int
) -> tuple[list[dict], float]:
    """Mean acceptance length, acceptance rate and TPOT per gamma; plain decoding measured before and after."""
    gammas = _sweep_gammas(backend, profile)
    for gamma in (0, gammas[0]):  # warm-up: first calls pay for allocations and lazy initialisation
        backend.generate(requests[:1], gamma, profile.temperature, seed)
    plain_before = pooled_tpot_ms(backend.generate(requests, 0, profile.temperature, seed))
    rows = [_sweep_row(gamma, backend.generate(requests, gamma, profile.temperature, seed)) for gamma in gammas]
    plain_after = pooled_tpot_ms(backend.generate(requests, 0, profile.temperature, seed))
    return rows, (plain_before + plain_after) / 2


def _paired_runs(
    backend: EvaluationBackend, requests: list[EvalRequest], gamma: int, temperature: float, seed: int
) -> tuple[list[RequestResult], list[RequestResult]]:
    """Each request with speculation and then without, back to back, so a change in machine load hits both
    sides of its ratio."""
    spec: list[RequestResult] = []
    plain: list[RequestResult] = []
    for index, request in enumerate(requests):
        for results, g in ((spec, gamma), (plain, 0)):
            (one,) = backend.generate([request], g, temperature, seed + index)
            one.index = index
            results.append(one)
    return spec, plain


def paired_speedup(spec: list, plain: list) -> float:
    """Median over requests of plain TPOT / speculative TPOT: robust to a burst of load on a shared machine."""
    from statistics import median

    ratios = [
        p.tpot_ms / s.tpot_ms
        for s, p in zip(spec, plain, strict=True)
        if s.tpot_ms > 0 and not math.isnan(s.tpot_ms) and not math.isnan(p.tpot_ms)
    ]
    return median(ratios) if ratios else math.nan


@dataclass(frozen=True)
class _Workload:
    """What the checklist runs, whichever way its backend measures it."""

    requests: list[EvalRequest]  # the validation set
    long_requests: list[EvalRequest]
    captured_requests: list[EvalRequest]  # held-out captured traffic (empty when none was given)
    profile: ValidationProfile
    seed: int
    stress: StressLoad | None
    knee_floor: float  # the acceptance the knee must clear
    logger: Any

    @property
    def greedy_set(self) -> list[EvalRequest]:
        """The requests run at T=0 too when the deployment's temperature is above 0 (the fallback-equivalence set)."""
        return self.requests[:GREEDY_CHECK_REQUESTS]


@dataclass
class _AtKnee:
    """The validation set at the gamma that will be served, after any step down from the sweep's knee."""

    knee: int
    rejected: list[dict]  # gammas validated before the knee and stepped down from: {gamma, failed_gates}
    spec: list[RequestResult]  # the validation set at the knee, at the deployment's temperature
    spec_greedy: list[RequestResult]  # T=0 with speculation (the validation set itself when T is 0)
    captured: list[RequestResult]  # held-out captured traffic at the knee (empty when none was given)
    plain: list[RequestResult] | None  # the set with speculation off, where it ran paired with `spec`


@dataclass
class _Runs:
    """Every request the checklist ran, by purpose; the gates are judged from these."""

    sweep: list[dict]
    sweep_plain_tpot: float
    fastest: int
    at_knee: _AtKnee
    plain: list[RequestResult]  # the validation set with speculation off
    plain_greedy: list[RequestResult]
    long: list[RequestResult]
    stress: dict | None  # `stress.stress_comparison` (+ `schedule_check`); None when stress did not run
    draft_sampling: DraftSamplingChoice


def _long_requests(
    requests: list[EvalRequest], target_dir: str, task_mix: dict[str, float], profile: ValidationProfile, seed: int
) -> list[EvalRequest]:
    """The long-output requests: as long as the profile asks, within what the target's context leaves. They run
    past the target's EOS, where the validation set's requests end there: the check is about acceptance deep into
    a long output, and a target that answers briefly would leave it nothing to measure."""
    longest_prompt = max(len(r.prompt) for r in requests)  # characters >= tokens for a byte-level BPE
    context_length = _context_length(target_dir)
    room = context_length - min(longest_prompt, context_length // 2) - 1
    long_tokens = min(profile.long_max_tokens or room, room)
    return [
        EvalRequest(r.prompt, r.task, long_tokens, ignore_eos=True)
        for r in validation_requests(task_mix, profile.long_requests, long_tokens, seed + 23)
    ]


def _knee(sweep: list[dict], profile: ValidationProfile, floor: float, logger: Any) -> tuple[int, int]:
    """(knee, fastest): the knee's acceptance must clear `floor` (the gate, or the stale line above it)."""
    fastest = gamma_knee(sweep, profile.knee_tolerance)
    knee = gamma_knee(sweep, profile.knee_tolerance, min_acceptance=floor)
    logger.info(
        "gamma sweep (gamma, TPOT ms, acceptance) %s; knee %d (fastest %d)",
        [(r["gamma"], r["tpot_ms"], r["acceptance_rate"]) for r in sweep],
        knee,
        fastest,
    )
    return knee, fastest


def _knee_candidates(sweep: list[dict], knee: int) -> list[int]:
    """The knee, then each smaller swept gamma, largest first: acceptance per draft token rises as gamma falls."""
    return [knee] + sorted((int(row["gamma"]) for row in sweep if int(row["gamma"]) < knee), reverse=True)


def _acceptance_gates(
    profile: ValidationProfile, acceptance: AcceptanceSummary, greedy_acceptance: AcceptanceSummary
) -> tuple[Gate, ...]:
    """The gates on the validation set's acceptance: they judge the drafter at the gamma it will be served at."""
    return (
        Gate("validation_acceptance_mean", greedy_acceptance.mean, profile.min_acceptance, ">", "pooled, T=0"),
        Gate(
            "acceptance_at_deployment_temperature",
            acceptance.mean,
            profile.min_acceptance,
            ">",
            f"T={profile.temperature:g}",
        ),
        Gate("acceptance_p50", acceptance.p50, profile.min_p50, ">", "per-request"),
        Gate("acceptance_p5", acceptance.p5, profile.min_p5, ">", "per-request"),
    )


def _captured_gates(floor: float, captured: list[RequestResult], gamma: int) -> tuple[Gate, ...]:
    """The gate on held-out prompts of the traffic a retrain learnt from: none when no traffic was given. A retrain
    answers a monitor that found the drafter under its lines, so it must clear the knee's floor (the gate, or the
    monitor's line above it) on that traffic: else the first review after its rollout flags it again."""
    if not captured:
        return ()
    return (
        Gate(
            "captured_traffic_acceptance",
            summarize_acceptance(captured).mean,
            floor,
            ">",
            f"{len(captured)} held-out prompts of the traffic the retrain learnt from, at gamma {gamma}",
        ),
    )


def _step_down(
    gamma: int,
    candidates: list[int],
    spec: list[RequestResult],
    spec_greedy: list[RequestResult],
    profile: ValidationProfile,
    rejected: list[dict],
    logger: Any,
    captured: list[RequestResult],
    floor: float,
) -> bool:
    """Whether to validate again at the next smaller gamma: the validation set at `gamma` failed an acceptance gate
    and a smaller gamma is left. The sweep picks the knee on a few requests' pooled rate, which says little about
    the whole set's percentiles (docs/VALIDATION.md). The served gamma is
    the fastest that clears every acceptance gate on the whole validation set, and on the held-out captured traffic
    when there is some (the sweep picks the knee on the declared mix); `rejected` records the others."""
    summaries = summarize_acceptance(spec), summarize_acceptance(spec_greedy)
    gates = _acceptance_gates(profile, *summaries) + _captured_gates(floor, captured, gamma)
    failed = [gate.name for gate in gates if not gate.passed]
    if not failed or gamma == candidates[-1]:
        return False
    rejected.append({"gamma": gamma, "failed_gates": failed})
    logger.warning(
        "validation at gamma %d failed %s; validating at gamma %d", gamma, ", ".join(failed), candidates[len(rejected)]
    )
    return True


def _settle_knee(
    backend: EvaluationBackend,
    work: _Workload,
    candidates: list[int],
    validation_set: Callable[[int], tuple[list[RequestResult], list[RequestResult] | None]],
) -> _AtKnee:
    """Validate at each candidate gamma, largest first, until one clears the acceptance gates (`_step_down`).
    `validation_set(gamma)` runs the validation set at that gamma, and the plain runs it paired with, if any."""
    profile, seed, captured_requests = work.profile, work.seed, work.captured_requests
    greedy_set, temperature = work.greedy_set, profile.temperature
    rejected: list[dict] = []
    for gamma in candidates:
        spec, plain = validation_set(gamma)
        spec_greedy = backend.generate(greedy_set, gamma, 0.0, seed) if temperature > 0 else spec
        captured = backend.generate(captured_requests, gamma, temperature, seed + 3000) if captured_requests else []
        if not _step_down(
            gamma, candidates, spec, spec_greedy, profile, rejected, work.logger, captured, work.knee_floor
        ):
            break
    return _AtKnee(gamma, rejected, spec, spec_greedy, captured, plain)


def sampling_figures(
    sweep: list[dict], knee: int, fastest: int, plain_tpot_ms: float, floor: float
) -> DraftSamplingFigures:
    """A draft sampling method's sweep summed up at its knee."""
    row = next(r for r in sweep if int(r["gamma"]) == knee)
    tpot = row["tpot_ms"]
    speedup = plain_tpot_ms / tpot if tpot and not math.isnan(tpot) and not math.isnan(plain_tpot_ms) else math.nan
    lower = row.get("acceptance_rate_lower", row["acceptance_rate"])
    return DraftSamplingFigures(
        gamma_knee=knee,
        gamma_fastest=fastest,
        tpot_ms=tpot,
        plain_tpot_ms=round(plain_tpot_ms, 4),
        speedup=round(speedup, 4),
        acceptance_rate=row["acceptance_rate"],
        acceptance_rate_lower=lower,
        mean_acceptance_length=row["mean_acceptance_length"],
        clears_floor=bool(lower > floor),
        gamma_sweep=sweep,
    )


def choose_draft_sampling(measured: dict[str, DraftSamplingFigures], tolerance: float) -> DraftSamplingChoice:
    """The better draft sampling at its knee, by the knee's own criterion: a knee whose acceptance clears the floor
    beats one that does not, then the higher speedup (plain / speculative TPOT, each method against the plain runs
    around its own sweep; the lower TPOT where one plain run, not yet measured, divides both), within `tolerance` a
    tie that goes to vLLM's default (the first of DRAFT_SAMPLINGS)."""
    by_tpot = any(math.isnan(figures.speedup) for figures in measured.values())

    def speed(name: str) -> float:
        figures = measured[name]
        value = (1.0 / figures.tpot_ms if figures.tpot_ms else math.nan) if by_tpot else figures.speedup
        return -math.inf if math.isnan(value) else value

    def figures_in_words(name: str) -> str:
        figures = measured[name]
        speedup = "" if by_tpot else f", {figures.speedup:.2f}x"
        floor = "" if figures.clears_floor else ", under the floor"
        return (
            f"{name}: gamma {figures.gamma_knee}, {figures.tpot_ms:.2f} ms{speedup}, "
            f"acceptance {figures.acceptance_rate:.2f}{floor}"
        )

    names = [name for name in DRAFT_SAMPLINGS if name in measured]
    contenders = [name for name in names if measured[name].clears_floor] or names
    best = max(speed(name) for name in contenders)
    chosen = next(name for name in contenders if speed(name) >= best / (1 + tolerance))
    if len(contenders) < len(names):
        why = "the only one whose knee clears the acceptance floor"
    elif speed(chosen) < best:
        why = f"within the knee tolerance of {tolerance:.0%} of the fastest, and a tie goes to vLLM's default"
    else:
        why = "the fastest at its knee"
    said = "; ".join(figures_in_words(name) for name in names)
    return DraftSamplingChoice(chosen, f"{chosen}: {why} ({said})", dict(measured))


def _measure_request_by_request(backend: EvaluationBackend, work: _Workload) -> _Runs:
    """Where switching gamma is free (the reference engine): the sweep, then each request with speculation and
    without back to back, so a burst of load on a shared machine hits both sides of a ratio."""
    requests, profile, seed, stress = work.requests, work.profile, work.seed, work.stress
    temperature = profile.temperature
    sweeps: dict[str | None, tuple[list[dict], float, int, int]] = {}
    for sampling in DRAFT_SAMPLINGS if temperature > 0 else (None,):
        if sampling is not None:
            backend.draft_sampling = sampling
        sweep, sweep_plain_tpot = _sweep(backend, requests[: profile.sweep_requests], profile, seed)
        sweeps[sampling] = (sweep, sweep_plain_tpot, *_knee(sweep, profile, work.knee_floor, work.logger))
    choice = _chosen_sampling(backend, work, {name: (s, k, f, t) for name, (s, t, k, f) in sweeps.items()})
    sweep, sweep_plain_tpot, knee, fastest = sweeps[choice.chosen]
    at_knee = _settle_knee(
        backend,
        work,
        _knee_candidates(sweep, knee),
        lambda gamma: _paired_runs(backend, requests, gamma, temperature, seed),
    )
    knee, plain = at_knee.knee, at_knee.plain
    assert plain is not None  # paired with the validation set at every gamma
    plain_greedy = (
        backend.generate(work.greedy_set, 0, 0.0, seed) if temperature > 0 else plain
    )  # the same at any gamma
    long = backend.generate(work.long_requests, knee, temperature, seed + 1000)
    stressed = None
    if stress is not None:
        backend.prepare_endpoints([knee, 0])  # both halves of stress: started side by side, before either runs
        stressed = _finish_stress(backend, stress, knee, stress.run(backend.endpoint(knee), SERVED_NAME))
    return _Runs(sweep, sweep_plain_tpot, fastest, at_knee, plain, plain_greedy, long, stressed, choice)


def _chosen_sampling(
    backend: EvaluationBackend, work: _Workload, sweeps: dict[str | None, tuple[list[dict], int, int, float]]
) -> DraftSamplingChoice:
    """The choice among the swept draft sampling methods ({method: (sweep, knee, fastest, plain TPOT)}; one None
    key at T=0, where it does not apply), left set on the backend for everything measured after."""
    if None in sweeps:
        return DraftSamplingChoice(None, NOT_AT_T0)
    measured = {
        name: sampling_figures(sweep, knee, fastest, plain, work.knee_floor)
        for name, (sweep, knee, fastest, plain) in sweeps.items()
        if name is not None
    }
    choice = choose_draft_sampling(measured, work.profile.knee_tolerance)
    backend.draft_sampling = choice.chosen
    work.logger.info("draft sampling %s", choice.reason)
    return choice


def _finish_stress(backend: EvaluationBackend, stress: StressLoad, knee: int, speculative: dict) -> dict:
    """The plain half of stress, the comparison with the speculative half, and, when that gives a schedule, the
    pair relaunched with it and loaded at each concurrency again."""
    stressed = stress_comparison(speculative, stress.run(backend.endpoint(0), SERVED_NAME), knee)
    schedule = stressed.get("schedule")
    if not schedule:
        return stressed
    return schedule_check(
        stressed, stress.levels(backend.endpoint(knee, [list(entry) for entry in schedule]), SERVED_NAME), knee
    )


def _measure_gamma_by_gamma(backend: EvaluationBackend, work: _Workload) -> _Runs:
    """Where each gamma is its own engine (vLLM): everything a server is needed for runs while it is up. The sweep
    runs from the largest gamma down, as the knee is usually a small one; the knee's requests and the speculative
    half of stress then reuse the last server when it is the knee's; plain decoding (the validation set, the greedy
    set at T>0, the plain half of stress) comes next on one server, and the relaunch with the measured schedule
    last. That is one start per swept gamma, one for plain decoding, one for the schedule, one more only when
    the knee is not the smallest gamma, and one per step down to a smaller gamma."""
    requests, profile, seed, stress = work.requests, work.profile, work.seed, work.stress
    temperature = profile.temperature
    sweep_count = min(len(requests), profile.sweep_requests)
    swept: dict[str | None, tuple[dict[int, list[RequestResult]], list[dict], int, int]] = {}
    # the chosen method last where it is known, so its smallest gamma's server is the one left running
    for sampling in DRAFT_SAMPLINGS if temperature > 0 else (None,):
        if sampling is not None:
            backend.draft_sampling = sampling
        runs = {
            gamma: backend.generate(requests[:sweep_count], gamma, temperature, seed)
            for gamma in sorted(_sweep_gammas(backend, profile), reverse=True)
        }
        rows = [_sweep_row(gamma, runs[gamma]) for gamma in sorted(runs)]
        swept[sampling] = (runs, rows, *_knee(rows, profile, work.knee_floor, work.logger))
    # Plain decoding runs later, on one server for both methods: until then their TPOTs order them as it would.
    choice = _chosen_sampling(
        backend, work, {name: (rows, knee, fastest, math.nan) for name, (_, rows, knee, fastest) in swept.items()}
    )
    by_gamma, sweep, knee, fastest = swept[choice.chosen]

    def validation_set(gamma: int) -> tuple[list[RequestResult], None]:
        spec = by_gamma[gamma] + backend.generate(requests[sweep_count:], gamma, temperature, seed + sweep_count)
        for index, result in enumerate(spec):
            result.index = index
        return spec, None

    at_knee = _settle_knee(backend, work, _knee_candidates(sweep, knee), validation_set)
    knee = at_knee.knee
    long = backend.generate(work.long_requests, knee, temperature, seed + 1000)
    speculative_stress = stress.run(backend.endpoint(knee), SERVED_NAME) if stress is not None else None

    plain = backend.generate(requests, 0, temperature, seed)
    plain_greedy = backend.generate(work.greedy_set, 0, 0.0, seed) if temperature > 0 else plain
    stressed = None
    if stress is not None and speculative_stress is not None:
        stressed = _finish_stress(backend, stress, knee, speculative_stress)
    sweep_plain_tpot = pooled_tpot_ms(plain[:sweep_count])
    if choice.chosen is not None:  # the speedups for the record: one plain run divides both, so the same choice
        choice = choose_draft_sampling(
            {
                name: sampling_figures(rows, k, f, sweep_plain_tpot, work.knee_floor)
                for name, (_, rows, k, f) in swept.items()
                if name is not None
            },
            profile.knee_tolerance,
        )
    return _Runs(sweep, sweep_plain_tpot, fastest, at_knee, plain, plain_greedy, long, stressed, choice)


def predict_serving(
    spec: list[RequestResult], captured: list[RequestResult], profile: ValidationProfile, gamma: int, seed: int
) -> Prediction | None:
    """What serving should measure at `gamma`: from the held-out captured traffic when a retrain learnt from some
    (the traffic it will serve), else from the validation set (the declared mix the deployment serves)."""
    from draftsync.stats import predicted_acceptance

    basis, traffic = (captured, "held-out captured traffic") if captured else (spec, "the validation set")
    level = 0.90
    window = profile.prediction_window_draft_tokens
    figures = predicted_acceptance([(r.accepted, r.draft_tokens) for r in basis], window, level=level, seed=seed)
    if figures is None:
        return None
    return Prediction(traffic, len(basis), gamma, profile.temperature, window, level, **figures)


def run_checklist(
    backend: EvaluationBackend,
    target_dir: str,
    drafter_dir: str,
    task_mix: dict[str, float],
    profile: ValidationProfile,
    *,
    seed: int = 0,
    data_check_failures: int | None = None,
    run_stress: bool = True,
    batch_sizes: Sequence[int] = (),
    no_schedule_reason: str | None = None,
    logger: logging.Logger | logging.LoggerAdapter[Any] | None = None,
    monitor_line: float | None = None,
    captured_prompts: Sequence[CapturedPrompt] = (),
) -> ChecklistResult:
    """Run every measurement through `backend` and judge the gates.

    Stress (`run_stress`, and `profile.stress_requests` > 0) loads the backend's served instances; with
    `batch_sizes` it also measures the per-batch-size schedule and relaunches the pair with it.
    `no_schedule_reason`: why the drafter cannot be served with a per-batch-size schedule
    (`checklist.unscheduled_reason` of its method); the result then records that reason and no schedule, whatever
    stress measured.
    `logger`: where the sweep and the verdict are logged (a Prefect run logger shows them in the UI).
    `monitor_line`: the serving monitor's highest line (its warning line, above the stale one). The knee must clear
    it as well as the gate: a pair served at a gamma whose acceptance sits under that line is flagged by the first
    weekly review, though a smaller gamma would have held. The gates stay the profile's, but for the captured
    traffic's, which the floor judges.
    `captured_prompts`: held-out requests of the served traffic a retrain learnt from, each replayed at the output
    length its client asked for (the profile's where the capture has none); the knee's acceptance on them
    is a gate of its own, at the profile's acceptance threshold, and a knee that fails it steps down as for the
    validation set's gates.
    Long: from the measurements to the result, each gate beside the figure it judges."""
    logger = logger or logging.getLogger(__name__)
    temperature = profile.temperature
    requests = validation_requests(task_mix, profile.requests, profile.max_tokens, seed + 11)
    long_requests = _long_requests(requests, target_dir, task_mix, profile, seed)
    long_tokens = long_requests[0].max_tokens
    stress = None
    if run_stress and profile.stress_requests > 0:
        stress = StressLoad(
            tuple(requests[: profile.stress_requests]),
            profile.qps * profile.stress_factor,
            profile.stress_concurrency,
            temperature,
            seed,
            () if no_schedule_reason else tuple(batch_sizes),
        )
    measure = _measure_request_by_request if getattr(backend, "cheap_gamma_switch", False) else _measure_gamma_by_gamma
    knee_floor = max(profile.min_acceptance, monitor_line or 0.0)
    captured_requests = [
        EvalRequest(prompt.text, CAPTURED_TASK, prompt.max_tokens or profile.max_tokens) for prompt in captured_prompts
    ]
    work = _Workload(requests, long_requests, captured_requests, profile, seed, stress, knee_floor, logger)
    runs = measure(backend, work)
    at_knee = runs.at_knee
    sweep, knee, fastest, rejected = runs.sweep, at_knee.knee, runs.fastest, at_knee.rejected
    spec, spec_greedy, captured = at_knee.spec, at_knee.spec_greedy, at_knee.captured
    plain, plain_greedy, long = runs.plain, runs.plain_greedy, runs.long
    acceptance, greedy_acceptance = summarize_acceptance(spec), summarize_acceptance(spec_greedy)
    speedup = paired_speedup(spec, plain)
    long_summary = summarize_acceptance(long)
    stress_result = runs.stress
    drafter_bytes, target_bytes = checkpoint_weight_bytes(drafter_dir), checkpoint_weight_bytes(target_dir)
    overhead = drafter_bytes / target_bytes

    from draftsync.speculative.methods import MTP
    from draftsync.speculative.methods.registry import drafter_method

    own_head = drafter_method(drafter_dir) == MTP.name
    data_gate = Gate(
        "data_coverage",
        data_check_failures,
        0,
        "==",
        "failed data expectations of the training set"
        if data_check_failures is not None
        else "no data-check record for this drafter",
    )
    gates = (
        *(() if own_head else (data_gate,)),
        *_acceptance_gates(profile, acceptance, greedy_acceptance),
        Gate("tpot_speedup", speedup, profile.min_speedup, ">", f"median per-request TPOT off / on at gamma {knee}"),
        Gate(
            "stress_speedup",
            stress_result["speedup"] if stress_result else None,
            profile.min_speedup,
            ">",
            f"{profile.stress_factor:g}x QPS" if stress_result else "not run",
        ),
        Gate(
            "stress_errors",
            stress_result["errors"] if stress_result else None,
            0,
            "==",
            "failed requests under stress" if stress_result else "not run",
        ),
        Gate(
            "long_output_acceptance",
            long_summary.mean,
            profile.min_long_acceptance,
            ">",
            f"{len(long_requests)} requests of {long_tokens} tokens",
        ),
        Gate(
            "fallback_equivalence",
            identical_outputs_share(spec_greedy, plain_greedy),
            1.0,
            "==",
            "share of greedy outputs identical with speculation off",
        ),
        Gate("drafter_memory_overhead", overhead, profile.max_memory_overhead, "<=", "drafter / target weight bytes"),
    )
    captured_summary = summarize_acceptance(captured) if captured else None
    gates += _captured_gates(knee_floor, captured, knee)
    rows = [{**r.row(), "phase": "validation", "gamma": knee} for r in spec]
    rows += [{**r.row(), "phase": "captured", "gamma": knee} for r in captured]
    rows += [{**r.row(), "phase": "plain", "gamma": 0} for r in plain]
    rows += [{**r.row(), "phase": "long", "gamma": knee} for r in long]
    result = ChecklistResult(
        profile=profile.name,
        backend=backend.name,
        temperature=temperature,
        gates=gates,
        gamma_sweep=sweep,
        gamma_knee=knee,
        gamma_fastest=fastest,
        knee_reason=knee_reason(sweep, knee, fastest, rejected, profile.knee_tolerance, knee_floor),
        draft_sampling=runs.draft_sampling,
        captured_acceptance=AcceptanceFigures.of(captured_summary) if captured_summary else None,
        gammas_rejected=rejected,
        sweep_plain_tpot_ms=round(runs.sweep_plain_tpot, 4),
        acceptance=AcceptanceFigures.of(acceptance),
        acceptance_greedy=round(greedy_acceptance.mean, 4),
        mean_acceptance_length=round(acceptance.mean_acceptance_length, 4),
        acceptance_by_position=[round(x, 4) for x in acceptance.per_position],
        acceptance_by_length=acceptance_by_length(spec + long, profile.length_buckets),
        tpot_ms=TpotMs(spec=round(pooled_tpot_ms(spec), 4), plain=round(pooled_tpot_ms(plain), 4)),
        speedup=round(speedup, 4),
        stress=stress_result,
        speculation_schedule=None if no_schedule_reason else (stress_result or {}).get("schedule"),
        speculation_schedule_note=no_schedule_reason,
        memory=MemoryFootprint(drafter_bytes, target_bytes, round(overhead, 4)),
        requests=RequestCounts(
            validation=len(requests),
            sweep=min(len(requests), profile.sweep_requests),
            long=len(long_requests),
            long_max_tokens=long_tokens,
            stress=min(len(requests), profile.stress_requests),
            engine_starts=getattr(backend, "starts", 0),
        ),
        rows=rows,
        prediction=predict_serving(spec, captured, profile, knee, seed),
    )
    logger.info(
        "validation at gamma %d: acceptance %.3f (P5 %.3f, P50 %.3f), speedup %.2fx; failed gates: %s",
        knee,
        acceptance.mean,
        acceptance.p5,
        acceptance.p50,
        speedup,
        result.failed_gates or "none",
    )
    return result
