"""The production guide's decision framework, branch by branch: each case checks the method, the gamma range and that
the reasons name the rule that decided (docs/RECOMMEND.md maps every rule to its test id)."""

from __future__ import annotations

import math
import re

import pytest
from draftsync.errors import DraftsyncError
from draftsync.planning.recommendation import recommend
from draftsync.planning.workload import Workload, eagle3_speedup_for_size, memory_budget, parse_params

# A 70B target on 4x A100-80GB at 50 ms, chat: the middle of every step; each case changes what it tests.
BASE = dict(params_b=70, gpus=4, gpu_memory_gb=80, tpot_ms=50, task="chat", output_tokens=1024, batch=1)
# A batch past the block rule's (8), for cases at gamma > 5 that test another rule: their drafter stays sequential.
SEQUENTIAL_BATCH = 16


def workload(**changes) -> Workload:
    return Workload(**{**BASE, **changes})


def applied_rules(recommendation) -> set[str]:
    """Every rule id the reasons name: the comma-separated ids inside [brackets]."""
    rules = set()
    for line in recommendation.reasons:
        for group in re.findall(r"\[([a-z0-9:, .\-]+)\]", line):
            rules.update(rule.strip() for rule in group.split(","))
    return rules


def reason_line(recommendation, prefix: str) -> str:
    lines = [line for line in recommendation.reasons if line.startswith(prefix)]
    assert len(lines) == 1, (prefix, recommendation.reasons)
    return lines[0]


# (changes to BASE, method, gamma range, rules that must be named, words the deciding line must hold)
CASES = [
    # Step 1: target size.
    pytest.param(
        dict(params_b=7, gpus=1, gpu_memory_gb=24),
        "none",
        (0, 0),
        {"size:small-none", "upgrade:not-applied", "speedup:none"},
        ("step 1", "< 13B"),
        id="size-small-none",
    ),
    pytest.param(
        dict(params_b=12.9), "none", (0, 0), {"size:small-none"}, ("step 1", "< 13B"), id="size-small-none-12.9b"
    ),
    pytest.param(
        dict(params_b=7, gpus=1, gpu_memory_gb=24, batch=8),
        "eagle3",
        (4, 5),
        {"size:small-batched", "speedup:batched-small"},
        ("step 1", "batched serving"),
        id="size-small-batched",
    ),
    pytest.param(
        dict(params_b=7, gpus=1, gpu_memory_gb=24, batch=SEQUENTIAL_BATCH, task="code"),
        "eagle3.1",
        (6, 6),
        {"size:small-batched", "upgrade:code-math"},
        ("step 1", "exception"),
        id="size-small-batched-code",
    ),
    pytest.param(
        dict(params_b=13, gpus=1, gpu_memory_gb=80),
        "eagle3",
        (4, 5),
        {"size:sweet-spot"},
        ("step 1", "13-70B"),
        id="size-sweet-spot-13b",
    ),
    pytest.param(
        dict(),
        "eagle3",
        (4, 5),
        {"size:sweet-spot", "upgrade:none"},
        ("step 1", "sweet spot"),
        id="size-sweet-spot-70b",
    ),
    pytest.param(
        dict(params_b=180, gpu_memory_gb=141),
        "eagle3",
        (4, 5),
        {"size:large-required", "memory:fits"},
        ("step 1", "required"),
        id="size-large-required",
    ),
    # Step 2: hardware.
    pytest.param(
        dict(params_b=7, gpus=1, gpu_memory_gb=24, batch=8),
        "eagle3",
        (4, 5),
        {"hw:single-24gb", "memory:fits"},
        ("step 2", "< 3%"),
        id="hw-single-24gb",
    ),
    pytest.param(
        dict(params_b=13, gpus=1, gpu_memory_gb=24),
        "eagle3",
        (4, 5),
        {"hw:single-24gb", "memory:does-not-fit"},
        ("step 2", "4-bit"),
        id="hw-single-24gb-bf16-short",
    ),
    pytest.param(
        dict(params_b=13, gpus=1, gpu_memory_gb=24, task="code", batch=SEQUENTIAL_BATCH),
        "eagle3.1",
        (6, 6),
        {"hw:single-24gb", "upgrade:code-math"},
        ("step 2", "two norms"),
        id="hw-single-24gb-eagle31",
    ),
    pytest.param(
        dict(params_b=34, gpus=1, gpu_memory_gb=24),
        "eagle3",
        (4, 5),
        {"hw:single-24gb-too-large", "memory:does-not-fit"},
        ("step 2", "<= 30B"),
        id="hw-single-24gb-over-30b",
    ),
    pytest.param(
        dict(params_b=30, gpus=1, gpu_memory_gb=80),
        "eagle3",
        (4, 5),
        {"hw:single-large", "memory:fits"},
        ("step 2", "memory arithmetic"),
        id="hw-single-large-gpu",
    ),
    pytest.param(
        dict(), "eagle3", (4, 5), {"hw:multi", "memory:fits"}, ("step 2", "does not choose"), id="hw-4x-a100-80gb"
    ),
    pytest.param(
        dict(gpus=2),
        "eagle3",
        (4, 5),
        {"hw:multi", "memory:does-not-fit"},
        ("step 2", "equivalent"),
        id="hw-multi-too-small",
    ),
    pytest.param(
        dict(params_b=180, gpus=8),
        "medusa",
        (4, 5),
        {"hw:cluster-8plus", "medusa:taken", "serving:vllm-medusa", "speedup:medusa-paper"},
        ("serving", "one gamma at every batch size"),
        id="hw-cluster-medusa",
    ),
    pytest.param(
        dict(gpus=8),
        "eagle3",
        (4, 5),
        {"hw:cluster-8plus", "medusa:not-taken"},
        ("medusa", "<= 70B"),
        id="hw-cluster-declines-medusa-70b",
    ),
    pytest.param(
        dict(params_b=180, gpus=8, task="code", batch=SEQUENTIAL_BATCH),
        "eagle3.1",
        (6, 6),
        {"medusa:not-taken"},
        ("medusa", "EAGLE 3.1 is required"),
        id="hw-cluster-declines-medusa-code",
    ),
    pytest.param(
        dict(params_b=180, gpus=8, output_tokens=8000),
        "eagle3.1",
        (4, 5),
        {"medusa:not-taken", "upgrade:long-output"},
        ("medusa", "EAGLE 3.1 is required"),
        id="hw-cluster-declines-medusa-long-output",
    ),
    pytest.param(
        dict(params_b=180, gpus=8, tpot_ms=25),
        "eagle3.1",
        (5, 5),
        {"medusa:not-taken", "upgrade:latency"},
        ("medusa", "EAGLE 3.1 is required"),
        id="hw-cluster-declines-medusa-interactive",
    ),
    pytest.param(
        dict(params_b=405, gpus=8),
        "eagle3",
        (4, 5),
        {"medusa:not-taken", "memory:does-not-fit"},
        ("medusa", "memory still binds"),
        id="hw-cluster-declines-medusa-memory",
    ),
    # Step 3: latency target.
    pytest.param(
        dict(tpot_ms=25),
        "eagle3.1",
        (5, 5),
        {"latency:interactive", "upgrade:latency"},
        ("step 3", "< 30 ms"),
        id="latency-interactive",
    ),
    pytest.param(
        dict(tpot_ms=30), "eagle3", (4, 5), {"latency:near-real-time"}, ("step 3", "30-80 ms"), id="latency-30ms"
    ),
    pytest.param(
        dict(tpot_ms=80), "eagle3", (4, 5), {"latency:near-real-time"}, ("step 3", "30-80 ms"), id="latency-80ms"
    ),
    pytest.param(dict(tpot_ms=120), "eagle3", (3, 3), {"latency:batch"}, ("step 3", "> 80 ms"), id="latency-batch"),
    pytest.param(
        dict(params_b=180, gpu_memory_gb=141, tpot_ms=120),
        "eagle3",
        (3, 3),
        {"latency:batch", "size:large-required"},
        ("step 3", "only for < 13B"),
        id="latency-batch-large",
    ),
    pytest.param(
        dict(params_b=7, gpus=1, gpu_memory_gb=24, batch=8, tpot_ms=120),
        "none",
        (0, 0),
        {"latency:batch-none", "size:small-batched"},
        ("step 3", "none"),
        id="latency-batch-none",
    ),
    # Step 4: task, and the gamma range where latency and task meet.
    pytest.param(
        dict(task="code", batch=SEQUENTIAL_BATCH),
        "eagle3.1",
        (6, 6),
        {"task:code-math", "gamma:overlap", "upgrade:code-math"},
        ("step 4", "larger gamma"),
        id="task-code",
    ),
    pytest.param(
        dict(task="math", batch=SEQUENTIAL_BATCH),
        "eagle3.1",
        (6, 6),
        {"task:code-math", "upgrade:code-math"},
        ("step 4", "larger gamma"),
        id="task-math",
    ),
    pytest.param(
        dict(task="chat"),
        "eagle3",
        (4, 5),
        {"task:chat-creative", "gamma:overlap"},
        ("step 4", "conservative"),
        id="task-chat",
    ),
    pytest.param(
        dict(task="creative"), "eagle3", (4, 5), {"task:chat-creative"}, ("step 4", "conservative"), id="task-creative"
    ),
    pytest.param(
        dict(task="translation"),
        "eagle3",
        (4, 4),
        {"task:translation-summary"},
        ("step 4", "gamma 4"),
        id="task-translation",
    ),
    pytest.param(
        dict(task="summary"), "eagle3", (4, 4), {"task:translation-summary"}, ("step 4", "gamma 4"), id="task-summary"
    ),
    pytest.param(
        dict(tpot_ms=25, task="code", batch=SEQUENTIAL_BATCH),
        "eagle3.1",
        (6, 8),
        {"gamma:overlap", "upgrade:gamma-over-5"},
        ("step 4", "6-8"),
        id="task-code-interactive",
    ),
    pytest.param(
        dict(tpot_ms=25, task="chat"),
        "eagle3.1",
        (5, 5),
        {"gamma:overlap", "latency:interactive"},
        ("step 4", "overlap in gamma 5"),
        id="task-chat-interactive",
    ),
    pytest.param(
        dict(tpot_ms=120, task="code"),
        "eagle3.1",
        (3, 3),
        {"gamma:latency-bounds", "upgrade:code-math"},
        ("step 4", "latency target bounds gamma"),
        id="conflict-batch-latency-code",
    ),
    pytest.param(
        dict(tpot_ms=25, task="translation"),
        "eagle3.1",
        (5, 5),
        {"gamma:latency-bounds"},
        ("step 4", "do not overlap"),
        id="conflict-interactive-translation",
    ),
    pytest.param(
        dict(tpot_ms=120, task="summary"),
        "eagle3",
        (3, 3),
        {"gamma:latency-bounds"},
        ("step 4", "do not overlap"),
        id="conflict-batch-latency-summary",
    ),
    # The EAGLE 3.1 upgrade.
    pytest.param(
        dict(output_tokens=5000),
        "eagle3.1",
        (4, 5),
        {"upgrade:long-output"},
        ("upgrade", "> 4K"),
        id="upgrade-long-output",
    ),
    pytest.param(
        dict(output_tokens=4096),
        "eagle3",
        (4, 5),
        {"upgrade:none"},
        ("upgrade", "no EAGLE 3.1 trigger"),
        id="upgrade-4096-not-long",
    ),
    pytest.param(
        dict(tpot_ms=25, task="code", output_tokens=6000, batch=SEQUENTIAL_BATCH),
        "eagle3.1",
        (6, 8),
        {"upgrade:latency", "upgrade:long-output", "upgrade:gamma-over-5", "upgrade:code-math"},
        ("upgrade", "gamma up to 8 > 5"),
        id="upgrade-gamma-over-5",
    ),
    pytest.param(
        dict(task="math", batch=SEQUENTIAL_BATCH),
        "eagle3.1",
        (6, 6),
        {"upgrade:code-math", "upgrade:gamma-over-5"},
        ("upgrade", "not as a ceiling"),
        id="upgrade-code-math-over-near-real-time",
    ),
    # Block drafters: one pass a proposal beats gamma sequential passes at small batch and high gamma.
    pytest.param(
        dict(tpot_ms=25, task="code"),
        "dflash",
        (6, 8),
        {"block:dflash", "serving:vllm-block", "speedup:vllm-size-curve", "speedup:dflash-paper", "upgrade:code-math"},
        ("block", "DFlash, the larger published gain"),
        id="block-dflash",
    ),
    pytest.param(
        dict(task="code", batch=8),
        "dflash",
        (6, 6),
        {"block:dflash", "memory:fits"},
        ("block", "batch 8 <= 8"),
        id="block-dflash-batch-8",
    ),
    pytest.param(
        dict(task="code", batch=9),
        "eagle3.1",
        (6, 6),
        {"block:large-batch"},
        ("block", "batch 9 > 8: the verify pass of a wide block is compute"),
        id="block-large-batch",
    ),
    pytest.param(
        dict(),
        "eagle3",
        (4, 5),
        {"block:low-gamma"},
        ("block", "gamma up to 5 <= 5"),
        id="block-low-gamma",
    ),
    pytest.param(
        dict(tpot_ms=120, task="code", batch=32),
        "eagle3.1",
        (3, 3),
        {"block:large-batch", "block:low-gamma"},
        ("block", "eagle3.1 stays"),
        id="block-large-batch-low-gamma",
    ),
    pytest.param(
        dict(params_b=180, gpu_memory_gb=141, task="code"),
        "peagle",
        (6, 6),
        {"block:peagle-large", "serving:vllm-block", "speedup:peagle-paper", "size:large-required"},
        ("block", "> 70B, where drafter training cost"),
        id="block-peagle-large",
    ),
    pytest.param(
        dict(params_b=13, gpus=1, gpu_memory_gb=24, task="code"),
        "peagle",
        (6, 6),
        {"block:peagle-memory", "hw:single-24gb"},
        ("block", "which a DFlash drafter (7%) exceeds"),
        id="block-peagle-24gb",
    ),
    pytest.param(
        dict(params_b=30, gpus=1, gpu_memory_gb=80, task="code"),
        "peagle",
        (6, 6),
        {"block:peagle-memory", "memory:fits"},
        ("block", "does not fit (0.2 GB short)"),
        id="block-peagle-memory",
    ),
    pytest.param(
        dict(params_b=7, gpus=1, gpu_memory_gb=80, batch=4, task="code"),
        "dflash",
        (6, 6),
        {"size:small-batched", "block:dflash", "speedup:batched-small", "speedup:dflash-paper"},
        ("block", "batch 4 <= 8"),
        id="block-dflash-small-batched",
    ),
    pytest.param(
        dict(params_b=8, gpus=1, tpot_ms=25, task="code"),
        "none",
        (0, 0),
        {"size:small-none", "block:not-applied"},
        ("block", "no speculative decoding"),
        id="block-not-applied-small",
    ),
]

ALL_RULES = {
    "size:small-none",
    "size:small-batched",
    "size:sweet-spot",
    "size:large-required",
    "hw:single-24gb",
    "hw:single-24gb-too-large",
    "hw:single-large",
    "hw:multi",
    "hw:cluster-8plus",
    "medusa:taken",
    "medusa:not-taken",
    "serving:vllm-medusa",
    "latency:interactive",
    "latency:near-real-time",
    "latency:batch",
    "latency:batch-none",
    "task:code-math",
    "task:chat-creative",
    "task:translation-summary",
    "gamma:overlap",
    "gamma:latency-bounds",
    "upgrade:latency",
    "upgrade:long-output",
    "upgrade:gamma-over-5",
    "upgrade:code-math",
    "upgrade:none",
    "upgrade:not-applied",
    "gamma:start-4",
    "speedup:none",
    "speedup:batched-small",
    "speedup:vllm-size-curve",
    "speedup:eagle31-lift",
    "speedup:medusa-paper",
    "memory:fits",
    "memory:does-not-fit",
    "block:dflash",
    "block:peagle-large",
    "block:peagle-memory",
    "block:large-batch",
    "block:low-gamma",
    "block:not-applied",
    "serving:vllm-block",
    "speedup:dflash-paper",
    "speedup:peagle-paper",
}


@pytest.mark.parametrize(("changes", "method", "gamma", "rules", "deciding_line"), CASES)
def test_decision_table(changes, method, gamma, rules, deciding_line):
    recommendation = recommend(workload(**changes))
    assert recommendation.method == method
    assert recommendation.gamma_range == gamma
    named = applied_rules(recommendation)
    assert rules <= named, (rules - named, recommendation.reasons)
    prefix, words = deciding_line
    assert words in reason_line(recommendation, prefix)


def test_the_table_exercises_every_rule():
    named = set()
    for case in CASES:
        named |= applied_rules(recommend(workload(**case.values[0])))
    assert named == ALL_RULES


@pytest.mark.parametrize("changes", [case.values[0] for case in CASES], ids=[case.id for case in CASES])
def test_every_step_has_one_line_naming_its_rule(changes):
    recommendation = recommend(workload(**changes))
    starts = [line.split(" [")[0] for line in recommendation.reasons]
    assert starts[:5] == ["step 1 size", "step 2 hardware", "step 3 latency", "step 4 task", "upgrade"]
    assert starts[-2:] == ["speedup", "memory"]
    assert starts.count("block") == 1 and starts.index("block") > starts.index("upgrade")
    assert all(re.search(r"\[[a-z0-9]+:[a-z0-9.\-]+", line) for line in recommendation.reasons)


def test_medusa_is_served_by_vllm_within_its_limits():
    recommendation = recommend(workload(params_b=180, gpus=8))
    assert recommendation.method == "medusa" and recommendation.gamma_range == (4, 5)
    serving = reason_line(recommendation, "serving")
    assert "method 'medusa'" in serving and "no per-batch-size schedule" in serving
    assert "at least 5 heads" in serving and "medusa_heads" in serving
    assert not [line for line in recommend(workload()).reasons if line.startswith("serving")]


@pytest.mark.parametrize(
    ("changes", "start"),
    [
        pytest.param(dict(), 4, id="start-4-inside-4-5"),
        pytest.param(dict(task="code"), 6, id="start-clamped-up-to-6"),
        pytest.param(dict(tpot_ms=25, task="code"), 6, id="start-clamped-up-in-6-8"),
        pytest.param(dict(tpot_ms=120), 3, id="start-clamped-down-to-3"),
        pytest.param(dict(params_b=7), 0, id="start-none"),
    ],
)
def test_gamma_start_is_4_clamped_into_the_range(changes, start):
    recommendation = recommend(workload(**changes))
    assert recommendation.gamma_start == start
    if recommendation.method != "none":
        low, high = recommendation.gamma_range
        assert low <= recommendation.gamma_start <= high
        assert f"-> {start};" in reason_line(recommendation, "gamma start")


def test_memory_arithmetic_for_70b_on_four_a100s():
    recommendation = recommend(workload(tpot_ms=25, task="code", output_tokens=6000, batch=SEQUENTIAL_BATCH))
    memory = recommendation.memory
    assert memory.target_weights_gb == pytest.approx(140.0)  # 70e9 params x 2 bytes
    assert memory.drafter_share == 0.03 and memory.drafter_gb == pytest.approx(4.2)
    assert memory.kv_headroom_gb == pytest.approx(64.0)  # 20% of 320 GB
    assert memory.required_gb == pytest.approx(208.2)
    assert memory.available_gb == pytest.approx(320.0)
    assert memory.fits and recommendation.fits
    assert recommendation.drafter_memory_gb == memory.drafter_gb
    for figure in ("140 GB", "4.2 GB", "64 GB", "208.2 GB", "4 x 80 GB = 320 GB", "111.8 GB spare"):
        assert figure in memory.arithmetic
    assert memory.arithmetic in reason_line(recommendation, "memory")


@pytest.mark.parametrize(
    ("changes", "drafter_gb", "fits"),
    [
        pytest.param(dict(params_b=180, gpus=8), 18.0, True, id="medusa-5-percent"),
        pytest.param(dict(params_b=7), 0.0, True, id="none-has-no-drafter"),
        pytest.param(dict(gpus=2), 4.2, False, id="70b-on-2x80-short"),
        pytest.param(dict(tpot_ms=25, task="code"), 9.8, True, id="dflash-7-percent"),
        pytest.param(dict(params_b=180, gpu_memory_gb=141, task="code"), 10.8, True, id="peagle-eagle3s-3-percent"),
    ],
)
def test_drafter_share_per_method(changes, drafter_gb, fits):
    recommendation = recommend(workload(**changes))
    assert recommendation.drafter_memory_gb == pytest.approx(drafter_gb)
    assert recommendation.fits is fits
    assert ("GB short" in recommendation.memory.arithmetic) is (not fits)


@pytest.mark.parametrize(("gpu_memory_gb", "fits"), [(51.5, True), (51.4, False)])
def test_fits_is_needed_at_most_available(gpu_memory_gb, fits):
    # 20B: 40 GB + 3% = 1.2 GB + 20% of 51.5 GB = 10.3 GB -> exactly 51.5 GB
    budget = memory_budget(workload(params_b=20, gpus=1, gpu_memory_gb=gpu_memory_gb), "eagle3")
    assert budget.fits is fits


@pytest.mark.parametrize(
    ("params_b", "speedup"),
    [
        (13, 1.4),
        (30, 1.7),
        (70, 2.1),
        (20, 1.4 + 0.3 * math.log(20 / 13) / math.log(30 / 13)),
        (50, 1.7 + 0.4 * math.log(50 / 30) / math.log(70 / 30)),
        (8, 1.4),
        (405, 2.1),
    ],
)
def test_eagle3_speedup_is_log_linear_between_the_seed_figures(params_b, speedup):
    assert eagle3_speedup_for_size(params_b) == pytest.approx(speedup)


@pytest.mark.parametrize(
    ("changes", "speedup"),
    [
        pytest.param(dict(params_b=50), (1.94, 1.94), id="eagle3-50b"),
        pytest.param(
            dict(tpot_ms=25, task="code", batch=SEQUENTIAL_BATCH), (2.1, 2.46), id="eagle31-lift-above-gamma-5"
        ),
        pytest.param(dict(tpot_ms=25, task="code"), (2.1, 5.25), id="dflash-2.5x-eagle3"),
        pytest.param(dict(params_b=7, batch=4, gpus=1, task="code"), (1.3, 3.75), id="dflash-batched-small"),
        pytest.param(dict(params_b=180, gpu_memory_gb=141, task="code"), (2.31, 2.86), id="peagle-1.10-1.36x"),
        pytest.param(dict(output_tokens=8000), (2.1, 2.1), id="eagle31-no-lift-at-gamma-5"),
        pytest.param(dict(params_b=7, batch=8), (1.3, 1.5), id="batched-small"),
        pytest.param(dict(params_b=180, gpus=8), (2.0, 2.5), id="medusa"),
        pytest.param(dict(params_b=7), (1.0, 1.0), id="none"),
    ],
)
def test_expected_speedup(changes, speedup):
    assert recommend(workload(**changes)).expected_speedup == pytest.approx(speedup)


def test_block_drafters_are_served_by_vllm_within_their_limits():
    """vLLM serves a block drafter one gamma at every batch size, up to what its one pass was trained to draft: the
    serving line names the profile field that bounds it (DFlash's block holds the committed token too)."""
    dflash = recommend(workload(tpot_ms=25, task="code"))
    serving = reason_line(dflash, "serving")
    assert "method 'dflash')" in serving and "no per-batch-size schedule" in serving
    assert "block_size >= 9" in serving and "parallel_drafting" not in serving
    peagle = recommend(workload(params_b=180, gpu_memory_gb=141, tpot_ms=25, task="code"))
    serving = reason_line(peagle, "serving")
    assert "method 'eagle3', parallel_drafting: true" in serving and "max_draft_tokens >= 8" in serving
    assert "P-EAGLE is EAGLE-3's layer plus one learned vector" in reason_line(peagle, "step 2")
    assert "keeps the < 3% budget" in reason_line(
        recommend(workload(params_b=13, gpus=1, gpu_memory_gb=24, task="code")), "step 2"
    )
    assert "budgeted at its own 7%" in reason_line(dflash, "step 2")


def test_the_block_rule_changes_the_drafter_not_the_gamma_it_was_given():
    """Where the block rule applies the gamma range and start are those the sequential drafter gets past its batch
    limit; where it does not apply nothing changes but its own line."""
    from itertools import product

    from draftsync.planning.workload import TASKS
    from draftsync.speculative.methods import METHODS

    for params_b, tpot_ms, task, batch in product((7, 13, 30, 70, 180), (25, 50, 120), TASKS, (1, 4, 8)):
        shape = dict(params_b=params_b, tpot_ms=tpot_ms, task=task, gpu_memory_gb=141)
        block = recommend(workload(**shape, batch=batch))
        sequential = recommend(workload(**shape, batch=SEQUENTIAL_BATCH))
        if params_b >= 13:  # batch decides nothing else from 13B up
            assert (block.gamma_range, block.gamma_start) == (sequential.gamma_range, sequential.gamma_start)
        if block.method in METHODS and METHODS[block.method].drafts_block:
            assert block.gamma_range[1] > 5 and sequential.method in ("eagle3", "eagle3.1")
        elif params_b >= 13:
            assert block.method == sequential.method
            assert [r for r in block.reasons if not r.startswith("block")] == [
                r for r in sequential.reasons if not r.startswith("block")
            ]


def test_a_dflash_upper_end_never_passes_its_authors_best():
    from draftsync.planning.recommendation import _block_speedup

    (low, high), line = _block_speedup("dflash", (3.0, 3.0), "speedup:vllm-size-curve", "a test")
    assert (low, high) == (3.0, 6.17) and "at most 6.17x" in line


@pytest.mark.parametrize(
    ("text", "billions"),
    [
        ("70B", 70.0),
        ("7b", 7.0),
        ("1.5B", 1.5),
        ("500M", 0.5),
        ("1T", 1000.0),
        ("70", 70.0),
        (" 8B ", 8.0),
    ],
)
def test_parse_params(text, billions):
    assert parse_params(text) == pytest.approx(billions)


@pytest.mark.parametrize("text", ["seventy", "70X", "", "0B", "-5B", "1.5.2B", "B"])
def test_parse_params_refuses_what_is_not_a_size(text):
    with pytest.raises(DraftsyncError) as caught:
        parse_params(text)
    assert "--params" in caught.value.what and "70B" in caught.value.fix


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        (dict(params_b=0), "params_b"),
        (dict(params_b=-1), "params_b"),
        (dict(params_b=float("nan")), "params_b"),
        (dict(gpus=0), "gpus"),
        (dict(gpus=1.5), "gpus"),
        (dict(gpu_memory_gb=0), "gpu_memory_gb"),
        (dict(tpot_ms=-5), "tpot_ms"),
        (dict(task="poetry"), "task"),
        (dict(output_tokens=0), "output_tokens"),
        (dict(batch=0), "batch"),
    ],
)
def test_bad_input_names_the_field_and_the_fix(changes, field):
    with pytest.raises(DraftsyncError) as caught:
        workload(**changes)
    assert caught.value.what.startswith(field)
    assert caught.value.fix
    if field == "task":
        assert "code, math, chat, creative, translation, summary" in caught.value.fix


def test_the_target_config_sets_weight_bytes_and_the_kv_cache_which_gqa_makes_fit():
    """A Llama-3-8B shape (32 layers, head_dim 128) serving 64 requests of 4096 tokens on one 80 GB GPU: with 8 KV
    heads its KV cache is 34.4 GB and fits beside 16 GB of weights; with 32 (no GQA) it is 137 GB and does not."""
    from draftsync.planning.workload import target_memory_facts

    gqa = target_memory_facts(32, {"kv_heads": 8, "head_dim": 128, "dtype": "bfloat16"})
    assert gqa == {"weight_bytes": 2.0, "kv_bytes_per_token": 2 * 32 * 8 * 128 * 2}
    shape = dict(params_b=8, gpus=1, gpu_memory_gb=80, tpot_ms=50, task="chat", output_tokens=4096, batch=64)
    fits = memory_budget(Workload(**shape, **gqa), "eagle3")
    assert fits.kv_cache_gb == pytest.approx(34.36, abs=0.01) and fits.kv_headroom_gb == fits.kv_cache_gb
    assert fits.fits and "the KV cache of 64 x 4096 tokens" in fits.arithmetic
    mha = target_memory_facts(32, {"kv_heads": 32, "head_dim": 128, "dtype": "bfloat16"})
    assert not memory_budget(Workload(**shape, **mha), "eagle3").fits
    # A float32 checkpoint weighs twice as much; a small KV cache leaves the headroom at its share of memory.
    fp32 = target_memory_facts(32, {"kv_heads": 8, "head_dim": 128, "dtype": "float32"})
    small = memory_budget(Workload(**{**shape, "batch": 1}, **fp32), "eagle3")
    assert small.target_weights_gb == 32 and small.kv_headroom_gb == pytest.approx(16)
    assert target_memory_facts(None, None) == {}  # an untagged version keeps bf16 and the share
    # Tagged with its description: an fp8 checkpoint's bytes a weight, and DeepSeek's latent KV cache.
    tagged = {"dtype": "bfloat16", "kv_heads": 128, "head_dim": 192, "quantization": "fp8"}
    fp8 = target_memory_facts(61, {**tagged, "weight_bytes": 673e9, "kv_bytes_per_token": 70272}, 671e9)
    assert fp8["weight_bytes"] == pytest.approx(1.003, abs=1e-3) and fp8["kv_bytes_per_token"] == 70272
