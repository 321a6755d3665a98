"""What the decision framework decides on: the workload, the production guide's thresholds and figures, the memory
budget.

The numbers are the production guide's, each with the sentence it comes from, and the block drafters' authors' (their
GPU figures, cited); the block rule's limits are this framework's choices and say so. `recommendation.py` applies them.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from draftsync.errors import DraftsyncError
from draftsync.speculative.methods import DFLASH, EAGLE3, EAGLE3_1, MEDUSA, PEAGLE

Task = Literal["code", "math", "chat", "creative", "translation", "summary"]
NO_DRAFTER = "none"  # the recommendation's method when speculative decoding does not pay
# What the framework can recommend: no drafter, or one of these methods (speculative/methods names them).
METHODS: tuple[str, ...] = (NO_DRAFTER, EAGLE3.name, EAGLE3_1.name, MEDUSA.name, DFLASH.name, PEAGLE.name)
TASKS: tuple[str, ...] = get_args(Task)

# --- The production guide's thresholds -------------------------------------------------------------------------------
SMALL_TARGET_BELOW_B = 13.0  # step 1: < 13B usually no speculative decoding
LARGE_TARGET_ABOVE_B = 70.0  # step 1: > 70B speculative decoding is required; 13B and 70B are in the sweet spot
SEED_SINGLE_GPU_MEMORY_GB = 24.0  # step 2: "one 24 GB GPU (RTX 4090)"
SEED_SINGLE_GPU_MAX_TARGET_B = 30.0  # step 2: "... runs targets <= 30B"
CLUSTER_GPUS = 8  # step 2: "8+ GPUs: Medusa is an option"
INTERACTIVE_TPOT_BELOW_MS = 30.0  # step 3: < 30 ms interactive; 30 and 80 are in 30-80
BATCH_TPOT_ABOVE_MS = 80.0  # step 3: > 80 ms batch processing
LONG_OUTPUT_ABOVE_TOKENS = 4096  # upgrade to 3.1 for outputs > 4K tokens (4K read as 4096)
HIGH_GAMMA_ABOVE = 5  # upgrade to 3.1 for gamma > 5
GAMMA_START = 4  # "start gamma at 4 and find the knee by measurement (5-6 typical)"
MEDUSA_MAX_HEADS = 5  # the production guide's Medusa ablation goes from 2 to 5 heads

# --- Block drafters (DFlash, P-EAGLE: one drafter pass drafts the whole proposal) ------------------------------------
# Where one pass a block beats gamma sequential passes: small batches, where a step's fixed cost and the drafter's
# passes dominate, and high gamma. Both limits are this framework's choices, not published figures: the batch up to
# which a block drafter is recommended (past it a wide block's verify pass turns compute, and a sequential drafter's
# higher per-token acceptance matters more), and "high gamma" read as the upgrade rule's gamma > 5.
BLOCK_MAX_BATCH = 8
BLOCK_GAMMA_ABOVE = HIGH_GAMMA_ABOVE

LATENCY_GAMMA: dict[str, tuple[int, int]] = {"interactive": (5, 8), "near-real-time": (4, 6), "batch": (2, 3)}
# Step 4 gives no numbers beyond "gamma 4" for translation/summary; the production guide's configuration section does:
# num_speculative_tokens "code 6-8, chat 3-5" (Snowflake's "code 6-8, chat 4-5" lies inside).
TASK_GAMMA: dict[str, tuple[int, int]] = {
    "code": (6, 8),
    "math": (6, 8),
    "chat": (3, 5),
    "creative": (3, 5),
    "translation": (4, 4),
    "summary": (4, 4),
}
TASK_GROUP = {
    "code": "code-math",
    "math": "code-math",
    "chat": "chat-creative",
    "creative": "chat-creative",
    "translation": "translation-summary",
    "summary": "translation-summary",
}

# --- Expected speedup --------------------------------------------------------------------------------
# vLLM's EAGLE-3 figures by target size; interpolated linearly in log(params), held flat past both ends.
EAGLE3_SPEEDUP_BY_SIZE_B: tuple[tuple[float, float], ...] = ((13.0, 1.4), (30.0, 1.7), (70.0, 2.1))
BATCHED_SMALL_SPEEDUP = (1.3, 1.5)  # < 13B, batched serving, EAGLE-3
SMALL_TARGET_SPEEDUP_BELOW = 1.3  # < 13B otherwise
MEDUSA_SPEEDUP = (2.0, 2.5)  # the production guide's only Medusa figure: Llama-2-Chat 7B
EAGLE31_ACCEPTANCE_LIFT = 0.88 / 0.75  # EAGLE-3 -> 3.1 acceptance at gamma 8
# The block drafters' authors' GPU figures (not measured here), each relative to EAGLE-3 on the same target:
# DFlash (arXiv 2602.06036, z-lab/dflash): up to 6.17x lossless on Qwen3-8B, about 2.5x EAGLE-3's speedup there.
DFLASH_OVER_EAGLE3 = 2.5
DFLASH_BEST_SPEEDUP = 6.17
# P-EAGLE (arXiv 2602.01469): 1.10-1.36x over EAGLE-3 on GPT-OSS-120B/20B and Qwen3-Coder-30B; vLLM's own benchmark
# 1.12x over the best EAGLE-3 configuration.
PEAGLE_OVER_EAGLE3 = (1.10, 1.36)
PEAGLE_VLLM_OVER_EAGLE3 = 1.12

# --- Memory ----------------------------------------------------------------------------------------
BYTES_PER_PARAM = 2  # target weights in bf16, unless the target's config says otherwise
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
# Drafter weights as a share of the target's weights. EAGLE-3/3.1: the production guide's "< 3%" on one GPU, inside
# "2-4% extra" on 4x A100-80GB (a real 70B EAGLE-3 drafter is ~1.3-2%, so this is an upper budget).
# Medusa: the production guide gives no figure; 5 heads (residual block + vocabulary projection each) ~5%.
# DFlash: two draft layers shaped like the target's and fc over three aux states (3 x hidden^2); the embedding and
# lm_head are the target's own, shared. Its parameter count (step_memory.drafter_parameters) is 6.1% of Llama-3.1-8B
# and 2.7% of Llama-3.1-70B, falling with the target's depth: 7% covers an 8B target, an upper budget above it.
# P-EAGLE: EAGLE-3's layer plus one learned vector (mask_hidden, 3 x hidden), so EAGLE-3's budget.
DRAFTER_SHARE: dict[str, float] = {
    NO_DRAFTER: 0.0,
    EAGLE3.name: 0.03,
    EAGLE3_1.name: 0.03,
    MEDUSA.name: 0.05,
    DFLASH.name: 0.07,
    PEAGLE.name: 0.03,
}
# Kept free for the KV cache, activations and CUDA graphs (vLLM itself takes only 90% of each GPU).
KV_HEADROOM_SHARE = 0.20


# The built-in corpora's task names (a target's task mix), in the framework's words: prose is conversational text,
# the framework's conservative case.
FRAMEWORK_TASK: dict[str, Task] = {"code": "code", "math": "math", "prose": "chat"}


def parse_params(text: str) -> float:
    """A parameter count as people write it ("70B", "7b", "1.5B", "500M", "1T") in billions."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*([bBmMtT]?)\s*", str(text))
    if match is None:
        raise DraftsyncError(
            f"--params {text!r} is not a parameter count",
            "write a number with an optional unit: 70B, 7b, 1.5B, 500M or 1T (plain means billions)",
        )
    number = float(match.group(1))
    scale = {"": 1.0, "b": 1.0, "m": 1e-3, "t": 1e3}[match.group(2).lower()]
    if number <= 0:
        raise DraftsyncError(f"--params {text!r} is not a positive parameter count", "give the target's size, e.g. 70B")
    return number * scale


@dataclass(frozen=True)
class Workload:
    """What a platform team knows about a target before it has a drafter."""

    params_b: float
    gpus: int
    gpu_memory_gb: float
    tpot_ms: float
    task: Task
    output_tokens: int = 1024
    batch: int = 1
    # Read from the target's config where it is known (`target_memory_facts`): bytes per weight as served, and the KV
    # cache one token takes (2 x layers x KV heads x head_dim x bytes). Without them: bf16, and KV a share of memory.
    weight_bytes: float = BYTES_PER_PARAM
    kv_bytes_per_token: float | None = None

    def __post_init__(self) -> None:
        _require_positive("params_b", self.params_b, "the target's size in billions of parameters, e.g. 70")
        _require_count("gpus", self.gpus, "the number of GPUs the target is served on, at least 1", most=65_536)
        _require_positive(
            "gpu_memory_gb", self.gpu_memory_gb, "the memory of one GPU in GB, e.g. 80 for an A100-80GB", most=100_000
        )
        _require_positive("tpot_ms", self.tpot_ms, "the time-per-output-token target in milliseconds, e.g. 25")
        if self.task not in TASKS:
            raise DraftsyncError(f"task {self.task!r} is unknown", f"use one of {', '.join(TASKS)}")
        _require_count("output_tokens", self.output_tokens, "the typical number of tokens per answer, at least 1")
        _require_count("batch", self.batch, "the number of requests served together, 1 for single-stream")
        _require_positive("weight_bytes", self.weight_bytes, "the bytes of one served weight, e.g. 2 for bf16")
        if self.kv_bytes_per_token is not None:
            _require_positive("kv_bytes_per_token", self.kv_bytes_per_token, "2 x layers x KV heads x head_dim x bytes")
        for field in ("params_b", "gpu_memory_gb", "tpot_ms"):  # 70 and 70.0 give the same numbers and JSON
            object.__setattr__(self, field, float(getattr(self, field)))

    @property
    def total_memory_gb(self) -> float:
        return self.gpus * self.gpu_memory_gb


def _require_positive(field: str, value: object, fix: str, most: float = 1e9) -> None:
    """A positive finite number no larger than `most`: beyond any real hardware or model, the arithmetic overflows."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise DraftsyncError(f"{field} = {value!r} must be a positive number", f"give {fix}")
    if value > most:
        raise DraftsyncError(f"{field} = {value!r} is beyond any real deployment (at most {most:g})", f"give {fix}")


def _require_count(field: str, value: object, fix: str, most: int = 1_000_000) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise DraftsyncError(f"{field} = {value!r} must be a whole number >= 1", f"give {fix}")
    if value > most:
        raise DraftsyncError(f"{field} = {value!r} is beyond any real deployment (at most {most:,})", f"give {fix}")


def target_memory_facts(num_layers: int | None, features: dict | None, parameters: int | None = None) -> dict[str, Any]:
    """`weight_bytes` and `kv_bytes_per_token` of a Workload, from a target's layer count and config features (its
    registry tags: dtype, KV heads, head_dim, and where its description was tagged, its weights' bytes at their
    quantization and its KV cache, latent for MLA); what the config does not say is left to the defaults."""
    features = features or {}
    facts: dict[str, Any] = {}
    dtype_bytes = DTYPE_BYTES.get(str(features.get("dtype") or "").replace("torch.", ""))
    if dtype_bytes is not None:
        facts["weight_bytes"] = float(dtype_bytes)
    if features.get("quantization") and features.get("weight_bytes") and parameters:  # its bytes as stored
        facts["weight_bytes"] = float(features["weight_bytes"]) / parameters
    if features.get("kv_bytes_per_token"):
        facts["kv_bytes_per_token"] = float(features["kv_bytes_per_token"])
        return facts
    kv_heads, head_dim = features.get("kv_heads"), features.get("head_dim")
    if num_layers and kv_heads and head_dim:
        # vLLM keeps the KV cache in the served dtype (bf16 for a float32 checkpoint on a GPU: "auto").
        facts["kv_bytes_per_token"] = float(2 * num_layers * kv_heads * head_dim * min(dtype_bytes or 2, 2))
    return facts


@dataclass(frozen=True)
class MemoryBudget:
    """Target weights + drafter + KV headroom against the GPUs' memory, with the sum written out."""

    target_weights_gb: float
    drafter_share: float
    drafter_gb: float
    kv_headroom_share: float
    kv_headroom_gb: float
    required_gb: float
    available_gb: float
    fits: bool
    arithmetic: str
    kv_cache_gb: float | None = None  # the workload's own KV cache (batch x output tokens), where the config gives it


def eagle3_speedup_for_size(params_b: float) -> float:
    """vLLM's EAGLE-3 speedup by target size (13B 1.4x, 30B 1.7x, 70B 2.1x), linear in log(params) between
    the anchors and held at the end figure outside them (the production guide quotes nothing beyond, so nothing is
    extrapolated)."""
    anchors = EAGLE3_SPEEDUP_BY_SIZE_B
    if params_b <= anchors[0][0]:
        return anchors[0][1]
    for (size_lo, speed_lo), (size_hi, speed_hi) in zip(anchors, anchors[1:], strict=False):
        if params_b <= size_hi:
            fraction = math.log(params_b / size_lo) / math.log(size_hi / size_lo)
            return speed_lo + fraction * (speed_hi - speed_lo)
    return anchors[-1][1]


def memory_budget(workload: Workload, method: str) -> MemoryBudget:
    """Target weights (bf16 unless the config says otherwise) + the method's drafter share + KV headroom (a share of
    memory, or the workload's own KV cache where the config gives its size and that is more), against gpus x memory
    per GPU."""
    target_gb = workload.params_b * workload.weight_bytes
    share = DRAFTER_SHARE[method]
    drafter_gb = target_gb * share
    available = workload.total_memory_gb
    kv_cache_gb = None
    if workload.kv_bytes_per_token is not None:
        kv_cache_gb = workload.kv_bytes_per_token * workload.batch * workload.output_tokens / 1e9
    headroom_gb = max(available * KV_HEADROOM_SHARE, kv_cache_gb or 0.0)
    required = target_gb + drafter_gb + headroom_gb
    fits = required <= available * (1 + 1e-12)
    if fits:
        verdict = f"fits ({gb_text(available - required)} GB spare)"
    else:
        verdict = f"does not fit ({gb_text(required - available)} GB short)"
    dtype = "bf16" if workload.weight_bytes == BYTES_PER_PARAM else "from its config"
    headroom = f"KV headroom {KV_HEADROOM_SHARE:.0%} of {gb_text(available)} GB"
    if kv_cache_gb is not None:
        headroom = (
            f"KV headroom the larger of {KV_HEADROOM_SHARE:.0%} of {gb_text(available)} GB and the KV cache of "
            f"{workload.batch} x {workload.output_tokens} tokens x {number_text(workload.kv_bytes_per_token or 0)} "
            f"bytes ({gb_text(kv_cache_gb)} GB)"
        )
    arithmetic = (
        f"target {params_text(workload.params_b)} x {number_text(workload.weight_bytes)} bytes ({dtype}) = "
        f"{gb_text(target_gb)} GB"
        f" + drafter {method} {share:.0%} of it = {gb_text(drafter_gb)} GB"
        f" + {headroom} = {gb_text(headroom_gb)} GB"
        f" = {gb_text(required)} GB needed of {workload.gpus} x {number_text(workload.gpu_memory_gb)} GB"
        f" = {gb_text(available)} GB:"
        f" {verdict}"
    )
    return MemoryBudget(
        target_weights_gb=round(target_gb, 3),
        drafter_share=share,
        drafter_gb=round(drafter_gb, 3),
        kv_headroom_share=KV_HEADROOM_SHARE,
        kv_headroom_gb=round(headroom_gb, 3),
        required_gb=round(required, 3),
        available_gb=round(available, 3),
        fits=fits,
        arithmetic=arithmetic,
        kv_cache_gb=None if kv_cache_gb is None else round(kv_cache_gb, 3),
    )


def number_text(value: float) -> str:
    return f"{value:g}"


def params_text(params_b: float) -> str:
    """A model size as people write it: 70B, 8.03B, 4.26M."""
    if params_b >= 1:
        return f"{params_b:.3g}B"
    return f"{params_b * 1000:.3g}M"


def gb_text(value: float) -> str:
    return f"{round(value, 2):g}"
