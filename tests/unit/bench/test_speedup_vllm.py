"""The arithmetic of `bench/speedup.py --engine vllm`: decode steps from vLLM's counts, the step-cost fit, the bound."""

from __future__ import annotations

import pytest
from bench.speedup_vllm import method_figures, run_figures, step_cost_fit
from draftsync.errors import DraftsyncError
from draftsync.serving.evaluation import RequestResult


def result(index: int, output_tokens: int, accepted: int, drafts: int, ttft_s: float, seconds: float, ids=()):
    return RequestResult(
        index=index,
        task="code",
        prompt_tokens=5,
        output_tokens=output_tokens,
        drafts=drafts,
        draft_tokens=2 * drafts,
        accepted=accepted,
        accepted_per_position=[accepted, 0],
        seconds=seconds,
        ttft_s=ttft_s,
        token_ids=list(ids),
    )


def test_steps_are_decode_tokens_less_accepted_drafts():
    # 8 tokens after the first, 4 of them accepted drafts: 4 steps of 10 ms, 2 tokens each
    results = [result(0, 9, 4, 4, 0.01, 0.05), result(1, 9, 4, 4, 0.02, 0.06)]
    figures = run_figures(results, wall_seconds=0.2)
    assert figures["tau"] == pytest.approx(2.0)
    assert figures["step_ms"] == pytest.approx(10.0)
    assert figures["tpot_ms"] == pytest.approx(5.0)
    assert figures["tokens_per_s"] == pytest.approx(90.0)


def test_fraction_of_bound_is_what_the_verify_step_costs_above_a_plain_one():
    # a plain step of 8 ms; a speculative step of 12 + 2 gamma ms: c = 2 / 8, verify = 12 / 8
    plain = {"step_ms": 8.0, "tpot_ms": 8.0, "tokens_per_s": 100.0}
    taus = {2: 2.5, 4: 3.0}
    spec = {
        g: {"step_ms": 12.0 + 2 * g, "tpot_ms": (12.0 + 2 * g) / tau, "tokens_per_s": 100.0, "tau": tau}
        for g, tau in taus.items()
    }
    figures = method_figures(spec, {2: plain, 4: plain}, {2: [[1]], 4: [[2]]}, [[1]])
    assert (figures["c"], figures["verify"]) == (pytest.approx(0.25), pytest.approx(1.5))
    for row in figures["gammas"]:
        g = row["gamma"]
        assert row["bound"] == pytest.approx(taus[g] / (1 + 0.25 * g), abs=1e-4)
        assert row["fraction_of_bound"] == pytest.approx((1 + 0.25 * g) / (1.5 + 0.25 * g), abs=1e-4)
    assert [row["outputs_identical_to_plain"] for row in figures["gammas"]] == [1.0, 0.0]
    assert figures["best_gamma"] == 2  # 8 * 2.5 / 16 = 1.25x against 8 * 3 / 20 = 1.2x


def test_one_gamma_gives_no_step_cost():
    with pytest.raises(DraftsyncError, match="slope"):
        step_cost_fit({3: 10.0}, 8.0)


def test_each_gamma_is_compared_with_its_own_paired_plain_run():
    """The machine slowed between two gammas: each speedup is against the plain run made just before it."""
    spec = {2: {"step_ms": 20.0, "tpot_ms": 10.0, "tokens_per_s": 100.0, "tau": 2.0}}
    spec[4] = {"step_ms": 30.0, "tpot_ms": 12.0, "tokens_per_s": 80.0, "tau": 2.5}
    plain = {2: {"step_ms": 10.0, "tpot_ms": 10.0, "tokens_per_s": 100.0}}
    plain[4] = {"step_ms": 18.0, "tpot_ms": 18.0, "tokens_per_s": 50.0}
    figures = method_figures(spec, plain, {2: [[1]], 4: [[1]]}, [[1]])
    by_gamma = {row["gamma"]: row for row in figures["gammas"]}
    assert by_gamma[2]["speedup"] == pytest.approx(1.0) and by_gamma[4]["speedup"] == pytest.approx(1.5)
    assert by_gamma[4]["paired_plain_tpot_ms"] == 18.0 and by_gamma[4]["speedup_tokens_per_s"] == pytest.approx(1.6)
    assert figures["c"] == pytest.approx(5.0 / 14.0, abs=1e-4)  # slope 5 ms per draft over the mean plain step
