"""The production guide's four-step decision framework (target size, hardware, latency target, task) as a pure function.

`recommend(Workload(...))` picks the drafter method and the gamma range a new target starts from, with the
production guide's expected speedup, a memory check and one reason line per step; the block rule then puts a block
drafter (DFlash, P-EAGLE) in place of EAGLE-3 / 3.1 where one drafter pass a proposal wins (small batch, high
gamma). It is a first guess: validation measures the gamma knee and that replaces `gamma_start`. Where the
production guide is silent or its rules conflict the choice made here is written into the reasons (the inputs,
thresholds and figures are in `workload.py`);
`docs/RECOMMEND.md` lists every rule, its branch and its test.

Every reason line carries the rule it applied in brackets, e.g. `step 1 size [size:sweet-spot]: ...`, so a
reader (or a test) can see which branch decided. No torch, no Prefect: this runs anywhere, instantly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from draftsync.planning.workload import (
    BATCH_TPOT_ABOVE_MS,
    BATCHED_SMALL_SPEEDUP,
    BLOCK_GAMMA_ABOVE,
    BLOCK_MAX_BATCH,
    CLUSTER_GPUS,
    DFLASH_BEST_SPEEDUP,
    DFLASH_OVER_EAGLE3,
    DRAFTER_SHARE,
    EAGLE31_ACCEPTANCE_LIFT,
    GAMMA_START,
    HIGH_GAMMA_ABOVE,
    INTERACTIVE_TPOT_BELOW_MS,
    LARGE_TARGET_ABOVE_B,
    LATENCY_GAMMA,
    LONG_OUTPUT_ABOVE_TOKENS,
    MEDUSA_MAX_HEADS,
    MEDUSA_SPEEDUP,
    NO_DRAFTER,
    PEAGLE_OVER_EAGLE3,
    PEAGLE_VLLM_OVER_EAGLE3,
    SEED_SINGLE_GPU_MAX_TARGET_B,
    SEED_SINGLE_GPU_MEMORY_GB,
    SMALL_TARGET_BELOW_B,
    SMALL_TARGET_SPEEDUP_BELOW,
    TASK_GAMMA,
    TASK_GROUP,
    MemoryBudget,
    Workload,
    eagle3_speedup_for_size,
    gb_text,
    memory_budget,
    number_text,
    params_text,
)
from draftsync.profiles import BLOCK_BOUNDS
from draftsync.speculative.methods import DFLASH, EAGLE3, EAGLE3_1, MEDUSA, METHODS, PEAGLE


@dataclass(frozen=True)
class Recommendation:
    """The method and gamma range to start a target's drafter with, and why."""

    method: str  # one of METHODS
    gamma_range: tuple[int, int]
    gamma_start: int
    expected_speedup: tuple[float, float]
    drafter_memory_gb: float
    fits: bool
    memory: MemoryBudget
    reasons: tuple[str, ...]

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "gamma_range": list(self.gamma_range),
            "gamma_start": self.gamma_start,
            "expected_speedup": list(self.expected_speedup),
            "drafter_memory_gb": self.drafter_memory_gb,
            "fits": self.fits,
            "memory": asdict(self.memory),
            "reasons": list(self.reasons),
        }


def _gamma_text(gamma: tuple[int, int]) -> str:
    return str(gamma[0]) if gamma[0] == gamma[1] else f"{gamma[0]}-{gamma[1]}"


def recommend(workload: Workload) -> Recommendation:
    """Apply the production guide's four steps, the EAGLE 3.1 upgrade, the block rule and the memory check to one
    workload.
    Long: the production guide's four steps and the upgrade read in the guide's order."""
    w = workload
    size = params_text(w.params_b)
    batched = w.batch >= 2

    # Step 1: target size.
    if w.params_b < SMALL_TARGET_BELOW_B:
        size_class = "small-batched" if batched else "small"
    elif w.params_b <= LARGE_TARGET_ABOVE_B:
        size_class = "sweet-spot"
    else:
        size_class = "large"
    speculate = size_class != "small"

    # Step 3: latency target (before step 2's Medusa reading, which depends on it).
    if w.tpot_ms < INTERACTIVE_TPOT_BELOW_MS:
        latency_class = "interactive"
    elif w.tpot_ms <= BATCH_TPOT_ABOVE_MS:
        latency_class = "near-real-time"
    else:
        latency_class = "batch"
    # "> 80 ms: gamma 2-3, or none": none is taken only where step 1 already said "usually none" (< 13B).
    latency_drops_speculation = speculate and latency_class == "batch" and size_class == "small-batched"
    speculate = speculate and not latency_drops_speculation

    # Step 4 + the gamma range: latency bounds gamma, the task picks where inside those bounds.
    latency_gamma = LATENCY_GAMMA[latency_class]
    task_gamma = TASK_GAMMA[w.task]
    lo, hi = max(latency_gamma[0], task_gamma[0]), min(latency_gamma[1], task_gamma[1])
    gamma_conflict = lo > hi
    if gamma_conflict:  # disjoint ranges: the end of the latency range nearest the task's wish
        nearest = latency_gamma[1] if task_gamma[0] > latency_gamma[1] else latency_gamma[0]
        lo = hi = nearest
    gamma = (lo, hi)

    # The EAGLE 3.1 upgrade: step 3's "< 30 ms -> EAGLE 3.1", outputs > 4K, gamma > 5, code / math.
    triggers = []
    if latency_class == "interactive":
        triggers.append(("upgrade:latency", f"step 3 asks for EAGLE 3.1 at TPOT {number_text(w.tpot_ms)} ms < 30 ms"))
    if w.output_tokens > LONG_OUTPUT_ABOVE_TOKENS:
        triggers.append(
            ("upgrade:long-output", f"outputs of {w.output_tokens} tokens > 4K ({LONG_OUTPUT_ABOVE_TOKENS})")
        )
    if gamma[1] > HIGH_GAMMA_ABOVE:
        triggers.append(("upgrade:gamma-over-5", f"gamma up to {gamma[1]} > {HIGH_GAMMA_ABOVE}"))
    if TASK_GROUP[w.task] == "code-math":
        triggers.append(("upgrade:code-math", f"task {w.task} (code / math gain most from 3.1)"))

    method: str = NO_DRAFTER
    if speculate:
        method = EAGLE3_1.name if triggers else EAGLE3.name

    # Step 2's Medusa option, read as: 8+ GPUs, a > 70B target (step 1: drafter training cost is the
    # constraint; Medusa trains on the target's own text, no hidden states), the Medusa budget fits
    # ("memory no longer binds", checked), and nothing asks for EAGLE 3.1 (Medusa has no drift fix).
    medusa_line = None
    if w.gpus >= CLUSTER_GPUS and speculate:
        medusa_fits = memory_budget(w, MEDUSA.name).fits
        blockers = []
        if size_class != "large":
            blockers.append(f"the target is {size} <= 70B, where an EAGLE-3 drafter costs little to train")
        if not medusa_fits:
            blockers.append("memory still binds: the Medusa budget does not fit")
        if triggers:
            blockers.append("EAGLE 3.1 is required (" + "; ".join(text for _, text in triggers) + ")")
        if blockers:
            medusa_line = (
                "medusa [medusa:not-taken]: the option is declined: "
                + "; ".join(blockers)
                + "; the production guide's default is EAGLE-3 (Medusa changes the target, a burden in multi-tenant "
                "serving)"
            )
        else:
            method = MEDUSA.name
            gamma = (min(gamma[0], MEDUSA_MAX_HEADS), min(gamma[1], MEDUSA_MAX_HEADS))
            medusa_line = (
                f"medusa [medusa:taken]: 8+ GPUs, a {size} > 70B target whose drafter training cost binds, "
                "the Medusa budget fits and nothing asks for EAGLE 3.1: Medusa with "
                f"{_gamma_text(gamma)} heads (training needs only the target's own text)"
            )

    # The block rule: one drafter pass a proposal instead of gamma sequential ones, at small batch and high gamma.
    if method in (EAGLE3.name, EAGLE3_1.name):
        method, block_line = _block_drafter(w, method, size_class, gamma)
    elif method == NO_DRAFTER:
        block_line = "block [block:not-applied]: no speculative decoding, no drafter to draft in blocks"
    else:
        block_line = f"block [block:not-applied]: {method}'s heads already draft the whole proposal in one pass"

    memory = memory_budget(w, method)
    if method == NO_DRAFTER:
        gamma, gamma_start = (0, 0), 0
    else:
        gamma_start = min(max(GAMMA_START, gamma[0]), gamma[1])

    reasons = [
        _size_reason(w, size_class),
        _hardware_reason(w, method, memory),
        _latency_reason(w, latency_class, latency_drops_speculation, speculate),
        _task_reason(w, task_gamma, latency_gamma, gamma, gamma_conflict, speculate),
        _upgrade_reason(method, triggers, latency_class),
    ]
    if medusa_line:
        reasons.append(medusa_line)
    reasons.append(block_line)
    if method == MEDUSA.name:
        reasons.append(
            f"serving [serving:vllm-medusa]: vLLM serves it (method {MEDUSA.vllm_method!r}) with one "
            "gamma at every batch "
            "size, since its Medusa drafts exactly num_speculative_tokens (validation records no per-batch-size "
            f"schedule), and with at most one draft token per head: train at least {gamma[1]} heads "
            "(the sync profile's medusa_heads) to serve the whole range"
        )
    if method != NO_DRAFTER and METHODS[method].drafts_block:
        knob, held = BLOCK_BOUNDS[METHODS[method].family]
        descriptor = METHODS[method]
        flag = ", parallel_drafting: true" if descriptor.parallel_drafting else ""
        reasons.append(
            f"serving [serving:vllm-block]: vLLM serves it (method {descriptor.vllm_method!r}{flag}) with one gamma "
            "at every batch size (validation records no per-batch-size schedule), and one pass drafts at most what "
            f"the drafter was trained for: train {knob} >= {gamma[1] + held} (the sync profile's {knob}) to serve "
            "the whole range"
        )
    if method != NO_DRAFTER:
        reasons.append(
            f"gamma start [gamma:start-4]: the production guide starts at {GAMMA_START} and finds the knee by "
            f"measurement (5-6 typical): {GAMMA_START} within {_gamma_text(gamma)} -> {gamma_start}; "
            "validation's measured knee replaces it"
        )
    speedup, speedup_line = _expected_speedup(w, method, size_class, gamma)
    reasons.append(speedup_line)
    reasons.append(_memory_reason(w, memory, size_class))

    return Recommendation(
        method=method,
        gamma_range=gamma,
        gamma_start=gamma_start,
        expected_speedup=speedup,
        drafter_memory_gb=memory.drafter_gb,
        fits=memory.fits,
        memory=memory,
        reasons=tuple(reasons),
    )


def _size_reason(w: Workload, size_class: str) -> str:
    size = params_text(w.params_b)
    if size_class == "small":
        return (
            f"step 1 size [size:small-none]: {size} < 13B: usually no speculative decoding (< 1.3x); "
            f"batch {w.batch} is not batched serving, so the EAGLE-3 exception does not apply"
        )
    if size_class == "small-batched":
        return (
            f"step 1 size [size:small-batched]: {size} < 13B, but batch {w.batch} is batched serving: "
            "the exception, EAGLE-3 (1.3-1.5x)"
        )
    if size_class == "sweet-spot":
        return f"step 1 size [size:sweet-spot]: {size} is in 13-70B, the sweet spot: EAGLE-3 or 3.1"
    return (
        f"step 1 size [size:large-required]: {size} > 70B: speculative decoding is required; drafter training "
        "cost and memory become the constraint"
    )


def _hardware_reason(w: Workload, method: str, memory: MemoryBudget) -> str:
    size = params_text(w.params_b)
    hardware = f"{w.gpus} x {number_text(w.gpu_memory_gb)} GB"
    fit_word = "fits" if memory.fits else "does not fit"
    same_size_note = ""
    if method == EAGLE3_1.name:
        same_size_note = (
            "; the rule names an EAGLE-3 drafter, and EAGLE 3.1 is the same drafter plus two norms "
            "(a few kB), so the 3.1 upgrade keeps the < 3% budget"
        )
    elif method == PEAGLE.name:
        same_size_note = (
            "; the rule names an EAGLE-3 drafter, and P-EAGLE is EAGLE-3's layer plus one learned vector, so it "
            "keeps the < 3% budget"
        )
    elif method == DFLASH.name:
        same_size_note = (
            f"; a DFlash drafter (two layers shaped like the target's) is budgeted at its own "
            f"{DRAFTER_SHARE[DFLASH.name]:.0%}, not the EAGLE-3 drafter's, and the memory arithmetic decides"
        )
    if w.gpus == 1 and w.gpu_memory_gb <= SEED_SINGLE_GPU_MEMORY_GB:
        if w.params_b > SEED_SINGLE_GPU_MAX_TARGET_B:
            return (
                f"step 2 hardware [hw:single-24gb-too-large]: one GPU of <= 24 GB runs targets <= 30B only; "
                f"{size} is beyond it: add GPUs (memory {fit_word})"
            )
        quantised_note = ""
        if not memory.fits:
            quantised_note = (
                "; the production guide's '<= 30B' holds only with ~4-bit weights (30B x 0.5 bytes = 15 GB): in "
                "bf16 it does not fit, so quantise the target or add GPUs"
            )
        return (
            f"step 2 hardware [hw:single-24gb]: one GPU of <= 24 GB ({hardware}): target <= 30B with an EAGLE-3 "
            f"drafter < 3% of the target, budgeted at 3%{same_size_note}{quantised_note}"
        )
    if w.gpus == 1:
        return (
            f"step 2 hardware [hw:single-large]: one GPU of {number_text(w.gpu_memory_gb)} GB; the production guide "
            "names only the 24 GB case, so its 30B limit is replaced by the memory arithmetic and its drafter budget "
            f"(< 3% of the target) is kept; memory {fit_word}{same_size_note}"
        )
    if w.gpus < CLUSTER_GPUS:
        return (
            f"step 2 hardware [hw:multi]: {hardware} is the production guide's 4x A100-80GB case or its equivalent: "
            "a 70B target with EAGLE 3.1, the drafter on the same GPUs (2-4% extra memory); this only says the drafter "
            f"fits, it does not choose between EAGLE-3 and 3.1; memory {fit_word}{same_size_note}"
        )
    return (
        f"step 2 hardware [hw:cluster-8plus]: {hardware}: 8+ GPUs, Medusa is an option and memory no longer "
        "binds; taken only for a > 70B target whose Medusa budget fits and that needs no EAGLE 3.1 "
        f"(see the medusa line); memory {fit_word}{same_size_note}"
    )


def _latency_reason(w: Workload, latency_class: str, drops: bool, speculate: bool) -> str:
    tpot = number_text(w.tpot_ms)
    not_applied = "" if speculate or drops else "; not applied: step 1 chose no speculative decoding"
    if latency_class == "interactive":
        return f"step 3 latency [latency:interactive]: TPOT {tpot} ms < 30 ms: EAGLE 3.1, gamma 5-8{not_applied}"
    if latency_class == "near-real-time":
        return (
            f"step 3 latency [latency:near-real-time]: TPOT {tpot} ms in 30-80 ms: EAGLE-3, gamma 4-6 (EAGLE-3 is "
            f"enough, a floor, not a ceiling on the 3.1 upgrade){not_applied}"
        )
    if drops:
        return (
            f"step 3 latency [latency:batch-none]: TPOT {tpot} ms > 80 ms: gamma 2-3 or none; none, because step 1 "
            "already says < 13B targets usually gain little and the loose latency target does not need the "
            "batched exception's 1.3-1.5x"
        )
    return (
        f"step 3 latency [latency:batch]: TPOT {tpot} ms > 80 ms: gamma 2-3 or none; speculation kept at gamma "
        f"2-3, since 'none' is taken only for < 13B targets (step 1 says why){not_applied}"
    )


def _task_reason(
    w: Workload,
    task_gamma: tuple[int, int],
    latency_gamma: tuple[int, int],
    gamma: tuple[int, int],
    conflict: bool,
    speculate: bool,
) -> str:
    group = TASK_GROUP[w.task]
    wish = {
        "code-math": "larger gamma (the configuration's 6-8), 3.1 gains most",
        "chat-creative": "conservative gamma (the configuration's 3-5), 3 ~ 3.1",
        "translation-summary": "EAGLE-3, gamma 4",
    }[group]
    line = f"step 4 task [task:{group}]: {w.task} -> {wish}"
    if not speculate:
        return line + "; not applied: no speculative decoding"
    if conflict:
        return (
            line + f"; conflict [gamma:latency-bounds]: the task's {_gamma_text(task_gamma)} and step 3's "
            f"{_gamma_text(latency_gamma)} do not overlap; the latency target bounds gamma, so the end of "
            f"{_gamma_text(latency_gamma)} nearest the task is taken: gamma {_gamma_text(gamma)}"
        )
    return (
        line + f"; [gamma:overlap] step 3's {_gamma_text(latency_gamma)} and the task's {_gamma_text(task_gamma)} "
        f"overlap in gamma {_gamma_text(gamma)}"
    )


def _upgrade_reason(method: str, triggers: list[tuple[str, str]], latency_class: str) -> str:
    if method == NO_DRAFTER:
        return "upgrade [upgrade:not-applied]: no speculative decoding, nothing to upgrade"
    if not triggers:
        return (
            "upgrade [upgrade:none]: no EAGLE 3.1 trigger (outputs <= 4K tokens, gamma <= 5, task not code / "
            f"math, TPOT >= 30 ms), so {method} stays"
        )
    ids = ", ".join(rule for rule, _ in triggers)
    because = "; ".join(text for _, text in triggers)
    floor = "" if latency_class == "interactive" else "; step 3's 'EAGLE-3' is read as enough, not as a ceiling"
    return f"upgrade [{ids}]: {EAGLE3} -> {EAGLE3_1} because {because}{floor}"


def _expected_speedup(
    w: Workload, method: str, size_class: str, gamma: tuple[int, int]
) -> tuple[tuple[float, float], str]:
    """The production guide's figures for the chosen method and size, and the line that says where they come from."""
    size = params_text(w.params_b)
    if method == NO_DRAFTER:
        below = f" (the seed: < {SMALL_TARGET_SPEEDUP_BELOW}x for < 13B)" if size_class.startswith("small") else ""
        return (1.0, 1.0), f"speedup [speedup:none]: 1.0x without speculative decoding{below}"
    if method == MEDUSA.name:
        return MEDUSA_SPEEDUP, (
            "speedup [speedup:medusa-paper]: 2.0-2.5x, the production guide's only Medusa figure (Llama-2-Chat "
            "7B), not measured at this size"
        )
    base = round(eagle3_speedup_for_size(w.params_b), 2)
    anchors = "13B 1.4x, 30B 1.7x, 70B 2.1x"
    curve = f"vLLM's EAGLE-3 figures ({anchors}) linear in log(params), held at 2.1x past 70B: {size} -> {base}x"
    if METHODS[method].drafts_block:
        if size_class == "small-batched":
            sequential, rule = BATCHED_SMALL_SPEEDUP, "speedup:batched-small"
            source = "the production guide's batched EAGLE-3 figure for < 13B, 1.3-1.5x"
        else:
            sequential, rule, source = (base, base), "speedup:vllm-size-curve", curve
        return _block_speedup(method, sequential, rule, source)
    if size_class == "small-batched":
        return BATCHED_SMALL_SPEEDUP, (
            "speedup [speedup:batched-small]: 1.3-1.5x, the production guide's batched EAGLE-3 figure for < 13B"
        )
    if method == EAGLE3_1.name and gamma[1] > HIGH_GAMMA_ABOVE:
        lifted = round(base * EAGLE31_ACCEPTANCE_LIFT, 2)
        return (base, lifted), (
            f"speedup [speedup:vllm-size-curve, speedup:eagle31-lift]: {curve}; the upper end "
            f"scales it by 3.1's acceptance lift at gamma 8 (75% -> 88%): {lifted}x"
        )
    note = ""
    if method == EAGLE3_1.name:
        note = "; no 3.1 lift at gamma <= 5 (the seed: 3 ~ 3.1 there)"
    if gamma[1] <= 3:
        note += "; the figures are not broken down by gamma, so at gamma 2-3 read this as an upper bound"
    return (base, base), f"speedup [speedup:vllm-size-curve]: {curve}{note}"


def _block_drafter(w: Workload, sequential: str, size_class: str, gamma: tuple[int, int]) -> tuple[str, str]:
    """The method after the block rule, and its line: a block drafter replaces the sequential EAGLE-3 / 3.1 one at
    batch <= BLOCK_MAX_BATCH and gamma > BLOCK_GAMMA_ABOVE; DFlash where its drafter fits and the target is <= 70B,
    else P-EAGLE, whose drafter costs EAGLE-3's."""
    choice = f"(the batch limit {BLOCK_MAX_BATCH} is this framework's choice, not a published figure)"
    held = []
    if w.batch > BLOCK_MAX_BATCH:
        held.append(
            (
                "block:large-batch",
                f"batch {w.batch} > {BLOCK_MAX_BATCH}: the verify pass of a wide block is compute there, and a "
                "sequential drafter's higher per-token acceptance matters more",
            )
        )
    if gamma[1] <= BLOCK_GAMMA_ABOVE:
        held.append(
            (
                "block:low-gamma",
                f"gamma up to {gamma[1]} <= {BLOCK_GAMMA_ABOVE}: few sequential drafter passes for one block pass "
                "to save",
            )
        )
    if held:
        ids = ", ".join(rule for rule, _ in held)
        because = "; ".join(text for _, text in held)
        return sequential, f"block [{ids}]: {sequential} stays, not a block drafter: {because} {choice}"
    why = (
        f"batch {w.batch} <= {BLOCK_MAX_BATCH} and gamma up to {gamma[1]} > {BLOCK_GAMMA_ABOVE}: a block drafter "
        f"drafts the whole proposal in one pass instead of {sequential}'s {gamma[1]} sequential passes, which with a "
        f"step's fixed cost dominate at small batch {choice}"
    )
    dflash_share = f"{DRAFTER_SHARE[DFLASH.name]:.0%}"
    peagle = (
        f"P-EAGLE, an EAGLE-3 layer drafting the block in one pass (EAGLE-3's {DRAFTER_SHARE[PEAGLE.name]:.0%} "
        "drafter budget)"
    )
    if size_class == "large":
        return PEAGLE.name, (
            f"block [block:peagle-large]: {why}; {params_text(w.params_b)} > 70B, where drafter training cost and "
            f"memory bind: {peagle}, not DFlash's two target-shaped layers; its authors' figures reach GPT-OSS-120B"
        )
    if w.gpus == 1 and w.gpu_memory_gb <= SEED_SINGLE_GPU_MEMORY_GB:
        return PEAGLE.name, (
            f"block [block:peagle-memory]: {why}; one GPU of <= 24 GB keeps step 2's < 3% drafter budget, which a "
            f"DFlash drafter ({dflash_share}) exceeds: {peagle}"
        )
    dflash_memory = memory_budget(w, DFLASH.name)
    if not dflash_memory.fits:
        short = gb_text(dflash_memory.required_gb - dflash_memory.available_gb)
        return PEAGLE.name, (
            f"block [block:peagle-memory]: {why}; a DFlash drafter ({dflash_share} of the target) does not fit "
            f"({short} GB short): {peagle}"
        )
    return DFLASH.name, (
        f"block [block:dflash]: {why}; DFlash, the larger published gain (about {number_text(DFLASH_OVER_EAGLE3)}x "
        f"EAGLE-3's speedup on Qwen3-8B), its drafter ({dflash_share} of the target) fits"
    )


def _block_speedup(
    method: str, sequential: tuple[float, float], rule: str, source: str
) -> tuple[tuple[float, float], str]:
    """A block drafter's range: the sequential EAGLE-3 figure this workload would get, scaled by its authors' ratio
    over EAGLE-3 (their GPU figures, not measured here)."""
    if method == DFLASH.name:
        upper = round(min(sequential[1] * DFLASH_OVER_EAGLE3, DFLASH_BEST_SPEEDUP), 2)
        return (sequential[0], upper), (
            f"speedup [{rule}, speedup:dflash-paper]: EAGLE-3 here: {source}; DFlash's authors report up to "
            f"{number_text(DFLASH_BEST_SPEEDUP)}x lossless on Qwen3-8B, about {number_text(DFLASH_OVER_EAGLE3)}x "
            "EAGLE-3's speedup there (arXiv 2602.06036, z-lab/dflash; their GPU figures, not ours, and not measured "
            f"at this size): the upper end scales EAGLE-3's by it, at most {number_text(DFLASH_BEST_SPEEDUP)}x -> "
            f"{upper}x; the lower end is EAGLE-3's own (a choice: validation measures what it gives)"
        )
    low, high = PEAGLE_OVER_EAGLE3
    lifted = (round(sequential[0] * low, 2), round(sequential[1] * high, 2))
    return lifted, (
        f"speedup [{rule}, speedup:peagle-paper]: EAGLE-3 here: {source}; P-EAGLE's authors report "
        f"{number_text(low)}-{number_text(high)}x over EAGLE-3 on GPT-OSS-120B/20B and Qwen3-Coder-30B (arXiv "
        f"2602.01469), vLLM's own benchmark {number_text(PEAGLE_VLLM_OVER_EAGLE3)}x over the best EAGLE-3 "
        f"configuration (their GPU figures, not ours): EAGLE-3's scaled by {number_text(low)}-{number_text(high)} "
        f"-> {lifted[0]}-{lifted[1]}x"
    )


def _memory_reason(w: Workload, memory: MemoryBudget, size_class: str) -> str:
    rule = "memory:fits" if memory.fits else "memory:does-not-fit"
    constraint = " (> 70B: memory is the constraint)" if size_class == "large" else ""
    fix = "" if memory.fits else "; add GPUs, use larger ones, or quantise the target"
    return f"memory [{rule}]{constraint}: {memory.arithmetic}{fix}"
