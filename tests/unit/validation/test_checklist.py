"""The checklist's arithmetic: per-request percentiles, the knee, the batch-size schedule, gates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from draftsync.serving.evaluation import RequestResult
from draftsync.validation.checklist import (
    Gate,
    acceptance_by_length,
    acceptance_rate_lower_bound,
    gamma_knee,
    identical_outputs_share,
    pooled_tpot_ms,
    speculation_schedule,
    summarize_acceptance,
)


def _result(
    index: int,
    accepted: int,
    draft_tokens: int,
    drafts: int,
    output_tokens: int = 20,
    per_position: list[int] | None = None,
    seconds: float = 1.0,
    ttft: float = 0.1,
) -> RequestResult:
    return RequestResult(
        index=index,
        task="code",
        prompt_tokens=5,
        output_tokens=output_tokens,
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        accepted_per_position=per_position or [],
        seconds=seconds,
        ttft_s=ttft,
        token_ids=list(range(output_tokens)),
    )


def test_percentiles_come_from_each_requests_own_rate_not_from_the_pooled_mean():
    # Nine long requests that accept everything and one short request that accepts nothing: the pooled
    # mean is high, and only per-request percentiles see the request the drafter failed.
    results = [_result(i, 100, 100, 50) for i in range(9)] + [_result(9, 0, 10, 5)]
    summary = summarize_acceptance(results)
    assert summary.mean == pytest.approx(900 / 910)
    rates = [1.0] * 9 + [0.0]
    assert summary.p5 == pytest.approx(np.percentile(rates, 5))
    assert summary.p5 < 0.6 < summary.mean
    assert summary.p50 == 1.0 and summary.p99 == 1.0


def test_requests_that_drafted_nothing_have_no_rate_and_do_not_count_in_percentiles():
    results = [_result(0, 3, 4, 2), _result(1, 0, 0, 0)]
    assert summarize_acceptance(results).p50 == pytest.approx(0.75)
    assert math.isnan(results[1].acceptance_rate)
    assert math.isnan(summarize_acceptance([_result(0, 0, 0, 0)]).p5)


def test_per_position_acceptance_is_pooled_over_drafts():
    results = [_result(0, 3, 4, 2, per_position=[2, 1]), _result(1, 1, 4, 2, per_position=[1, 0])]
    assert summarize_acceptance(results).per_position == pytest.approx([3 / 4, 1 / 4])


def test_the_knee_is_the_best_tpot_and_near_ties_go_to_the_smaller_gamma():
    sweep = [
        {"gamma": 2, "tpot_ms": 3.0},
        {"gamma": 3, "tpot_ms": 2.0},
        {"gamma": 4, "tpot_ms": 1.99},
        {"gamma": 5, "tpot_ms": 2.5},
    ]
    assert gamma_knee(sweep, tolerance=0.02) == 3
    assert gamma_knee(sweep, tolerance=0.0) == 4
    assert gamma_knee([{"gamma": 6, "tpot_ms": 1.0}, {"gamma": 2, "tpot_ms": 1.0}], tolerance=0.0) == 2
    with pytest.raises(ValueError):
        gamma_knee([])


def test_a_sweep_that_measured_no_tpot_has_its_smallest_gamma_as_the_knee():
    # Every sweep request ended at the target's EOS after one token: nothing says which gamma is faster.
    nan = float("nan")
    sweep = [{"gamma": 4, "tpot_ms": nan, "acceptance_rate": 0.9}, {"gamma": 3, "tpot_ms": nan}]
    assert gamma_knee(sweep) == 3
    assert gamma_knee(sweep, min_acceptance=0.5) == 3


def test_a_batch_size_schedule_drops_gamma_where_plain_decoding_is_faster():
    data = {
        1: {0: 10.0, 2: 6.0, 4: 5.0},
        4: {0: 10.0, 2: 6.5, 4: 6.4},  # within 2 %: the smaller gamma
        16: {0: 10.0, 2: 7.0, 4: 9.0},
        64: {0: 10.0, 2: 11.0, 4: 14.0},  # speculation costs more than it saves at a large batch
    }
    assert speculation_schedule(data) == [(1, 3, 4), (4, 63, 2), (64, 64, 0)]
    assert speculation_schedule({8: {0: 5.0, 3: 4.0}}) == [(1, 8, 3)]


def test_acceptance_by_output_length_bucket():
    results = [_result(0, 5, 10, 5, output_tokens=30), _result(1, 9, 10, 5, output_tokens=300)]
    buckets = acceptance_by_length(results, (0, 64, 256))
    assert [(b["min_tokens"], b["max_tokens"], b["requests"]) for b in buckets] == [
        (0, 63, 1),
        (64, 255, 0),
        (256, None, 1),
    ]
    assert [b["acceptance_rate"] for b in buckets] == [0.5, None, 0.9]


def test_tpot_excludes_the_prefill_and_pools_tokens():
    results = [
        _result(0, 0, 0, 0, output_tokens=11, seconds=1.1, ttft=0.1),
        _result(1, 0, 0, 0, output_tokens=21, seconds=0.5, ttft=0.3),
    ]
    assert pooled_tpot_ms(results) == pytest.approx(1000 * (1.0 + 0.2) / 30)


def test_gates_judge_strictly_and_an_unmeasured_gate_fails():
    assert Gate("a", 0.71, 0.70, ">").passed
    assert not Gate("a", 0.70, 0.70, ">").passed
    assert Gate("b", 0.15, 0.15, "<=").passed
    assert not Gate("c", None, 0, "==").passed
    assert not Gate("d", float("nan"), 1.0, ">").passed
    assert Gate("d", float("nan"), 1.0, ">").to_dict()["value"] is None


def test_identical_outputs_share():
    a = [_result(0, 0, 0, 0), _result(1, 0, 0, 0)]
    b = [_result(0, 0, 0, 0), _result(1, 0, 0, 0)]
    b[1].token_ids = [9]
    assert identical_outputs_share(a, b) == 0.5
    assert math.isnan(identical_outputs_share(a, b[:1]))


def test_the_knee_must_clear_the_acceptance_gate_when_some_gamma_does():
    sweep = [
        {"gamma": 2, "tpot_ms": 3.6, "acceptance_rate": 0.70},
        {"gamma": 3, "tpot_ms": 3.2, "acceptance_rate": 0.52},
        {"gamma": 4, "tpot_ms": 3.0, "acceptance_rate": 0.45},
    ]
    assert gamma_knee(sweep) == 4
    assert gamma_knee(sweep, min_acceptance=0.55) == 2
    assert gamma_knee(sweep, min_acceptance=0.90) == 4  # none clears: the fastest, and the gates will say so


def test_the_lower_bound_of_the_acceptance_rate_widens_with_the_spread_across_requests():
    steady = [_result(i, 60, 100, 20) for i in range(6)]
    assert acceptance_rate_lower_bound(steady) == pytest.approx(0.6)  # no spread: the rate itself
    spread = [_result(i, a, 100, 20) for i, a in enumerate((90, 80, 70, 50, 40, 30))]
    rates = np.array([0.9, 0.8, 0.7, 0.5, 0.4, 0.3])
    expected = 0.6 - 1.645 * rates.std(ddof=1) / math.sqrt(6)
    assert acceptance_rate_lower_bound(spread) == pytest.approx(expected)
    assert acceptance_rate_lower_bound(spread) < 0.55 < summarize_acceptance(spread).mean
    assert acceptance_rate_lower_bound(spread[:1]) == pytest.approx(0.9)  # one request: nothing to spread
    assert math.isnan(acceptance_rate_lower_bound([_result(0, 0, 0, 0)]))  # nothing drafted


def test_the_knee_needs_a_rate_that_clears_the_gate_by_more_than_its_sampling_error():
    # gamma 3 is faster and its sweep rate clears 0.55, but only by luck of the few requests measured
    sweep = [
        {"gamma": 2, "tpot_ms": 3.6, "acceptance_rate": 0.77, "acceptance_rate_lower": 0.68},
        {"gamma": 3, "tpot_ms": 3.0, "acceptance_rate": 0.56, "acceptance_rate_lower": 0.45},
    ]
    assert gamma_knee(sweep, min_acceptance=0.55) == 2
    # when no bound clears, the gamma most likely to clear: the highest bound, then the highest rate;
    # when no rate clears either, the fastest
    unsure = [{**row, "acceptance_rate_lower": 0.5} for row in sweep]
    assert gamma_knee(unsure, min_acceptance=0.55) == 2
    assert gamma_knee(unsure, min_acceptance=0.80) == 3


def test_when_no_gamma_surely_clears_the_gate_the_knee_is_the_one_most_likely_to():
    # the demo's v2 drafter: gamma 3 was faster and its sweep rate cleared 0.55 by 0.01; validated there, the
    # drafter measured 0.550 and failed, where gamma 2 (the higher bound) would have passed
    sweep = [
        {"gamma": 2, "tpot_ms": 4.16, "acceptance_rate": 0.6737, "acceptance_rate_lower": 0.5481},
        {"gamma": 3, "tpot_ms": 3.60, "acceptance_rate": 0.5595, "acceptance_rate_lower": 0.4793},
        {"gamma": 4, "tpot_ms": 3.81, "acceptance_rate": 0.4564, "acceptance_rate_lower": 0.3924},
    ]
    assert gamma_knee(sweep) == 3
    assert gamma_knee(sweep, min_acceptance=0.55) == 2
    assert gamma_knee(sweep, min_acceptance=0.50) == 2  # gamma 2's bound clears: speed decides among those that do
