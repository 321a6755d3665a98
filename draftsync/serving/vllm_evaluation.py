"""The vLLM evaluation backend: the validation checklist and benchmarks on a GPU worker.

`VllmBackend` runs each request alone through vLLM's offline `LLM` (one engine per gamma; gamma 0 has
no `speculative_config`) and counts it the way a served drafter is counted: vLLM keeps no per-request
acceptance, only the process-wide spec-decode counters that `LLM.get_metrics()` snapshots, so a
request's counts are the counters' deltas around its own `generate` call. The engine runs with
`disable_log_stats=False`, without which those counters are never recorded.

Counter names are those of `vllm/v1/spec_decode/metrics.py`. `get_metrics()` (`vllm/v1/metrics/reader.py`)
names counters without Prometheus' `_total` suffix, returns one object per label set (one per engine
under data parallelism, summed here), and turns the per-position counter into one `Vector` per label set.
The readers below take any objects with `name` and `value` / `values`, so they need no vllm import.

Timing: `seconds` is the wall-clock time of the request's `generate` call; `ttft_s` is vLLM's own
time from the request's arrival to its first token (`RequestOutput.metrics.first_token_latency`, V1).
A vLLM that reports no first-token time gives NaN, so TPOT is NaN too and a speedup gate compares
nothing and fails rather than passing on a guess.

Every request generates exactly `max_tokens` tokens (`ignore_eos`), as the reference engine does, so
both backends put the same load on the target.

The target and drafter directories must lie inside the model roots (model_paths.py), and `LLM(...)` gets
`trust_remote_code=True` only when DRAFTSYNC_TRUST_REMOTE_CODE is set (`llm_keywords`).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.serving.evaluation import EvalRequest, RequestResult
from draftsync.speculative.methods import (
    CHECKPOINT_METHODS,
    DRAFT_MODEL,
    METHODS,
    NGRAM,
    TRAINED_METHODS,
    VLLM_METHODS,
)

# vLLM's counter names as `LLM.get_metrics()` reports them (the `/metrics` text adds `_total`).
DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"

WARM_UP_PROMPT = "def main():\n    return 0\n"
MAX_CHAIN_GAMMA = 16  # chained drafters propose as far as asked; the reference backend stops at 16 too

# Arguments the backend sets itself; an extra LLM keyword may not override them.
_OWNED_LLM_ARGS = ("model", "tokenizer", "speculative_config", "tensor_parallel_size")


@dataclass(frozen=True)
class SpecDecodeCounts:
    """The four spec-decode counters at one moment, or the difference between two moments."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: tuple[int, ...] = ()

    def since(self, earlier: SpecDecodeCounts) -> SpecDecodeCounts:
        """What was counted between `earlier` and now; a counter that went down means the engine restarted."""
        width = max(len(self.accepted_per_position), len(earlier.accepted_per_position))
        now, then = _padded(self.accepted_per_position, width), _padded(earlier.accepted_per_position, width)
        delta = SpecDecodeCounts(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted - earlier.accepted,
            tuple(a - b for a, b in zip(now, then, strict=True)),
        )
        if min((delta.drafts, delta.draft_tokens, delta.accepted, *delta.accepted_per_position)) < 0:
            raise DraftsyncError(
                f"vLLM's spec-decode counters went down between two snapshots ({earlier} -> {self}): the engine "
                "was restarted or its metrics re-registered in between",
                "take both snapshots from the same running LLM, with nothing else creating an LLM in this process",
            )
        return delta


def llm_keywords(llm_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The extra keywords every `LLM(...)` of the backend gets: counters on, and `trust_remote_code` as
    DRAFTSYNC_TRUST_REMOTE_CODE allows (absent: the setting; True without the setting: refused)."""
    from draftsync.serving.vllm_args import trust_remote_code_setting

    owned = sorted(set(llm_kwargs) & set(_OWNED_LLM_ARGS))
    if owned:
        raise DraftsyncError(
            f"LLM argument(s) {', '.join(owned)} are set by the backend itself",
            "pass target_dir, drafter_dir, method and tensor_parallel_size instead",
        )
    if llm_kwargs.get("disable_log_stats"):
        raise DraftsyncError(
            "disable_log_stats=True was passed, which stops vLLM counting drafts",
            "leave disable_log_stats unset: the backend reads acceptance from those counters",
        )
    trusted = trust_remote_code_setting(llm_kwargs.get("trust_remote_code"))
    return {**llm_kwargs, "disable_log_stats": False, "trust_remote_code": trusted}


def _padded(values: Sequence[int], width: int) -> list[int]:
    return list(values) + [0] * (width - len(values))


def _base_name(name: str) -> str:
    return name[: -len("_total")] if name.endswith("_total") else name


def read_spec_decode_counts(metrics: Iterable[Any]) -> SpecDecodeCounts:
    """The spec-decode counters in a `get_metrics()` snapshot, summed over label sets (engines).

    Metrics of other names are skipped; a snapshot without the counters (speculation off) reads as zeros.
    """
    totals = {DRAFTS: 0, DRAFT_TOKENS: 0, ACCEPTED: 0}
    per_position: list[int] = []
    for metric in metrics:
        name = _base_name(str(getattr(metric, "name", "")))
        if name in totals:
            value = getattr(metric, "value", None)
            if value is None:
                raise DraftsyncError(
                    f"metric {name} has no counter value ({type(metric).__name__})",
                    "pass the list LLM.get_metrics() returns (vllm.v1.metrics.reader objects)",
                )
            totals[name] += int(value)
        elif name == ACCEPTED_PER_POSITION:
            values = getattr(metric, "values", None)
            if values is None:
                raise DraftsyncError(
                    f"metric {name} is not a per-position Vector ({type(metric).__name__})",
                    "pass the list LLM.get_metrics() returns (vllm.v1.metrics.reader objects)",
                )
            width = max(len(per_position), len(values))
            per_position = [
                a + b for a, b in zip(_padded(per_position, width), _padded(list(values), width), strict=True)
            ]
    return SpecDecodeCounts(totals[DRAFTS], totals[DRAFT_TOKENS], totals[ACCEPTED], tuple(int(v) for v in per_position))


def first_token_seconds(request_metrics: Any) -> float:
    """Time from a request's arrival to its first token, from `RequestOutput.metrics`; NaN when not reported.

    vLLM V1 gives `RequestStateStats.first_token_latency` (seconds, 0.0 until the first token);
    the older engine gave `RequestMetrics.arrival_time` and `first_token_time` (wall-clock stamps).
    """
    if request_metrics is None:
        return math.nan
    latency = getattr(request_metrics, "first_token_latency", None)
    if latency is not None:
        return float(latency) if latency > 0 else math.nan
    arrival = getattr(request_metrics, "arrival_time", None)
    first = getattr(request_metrics, "first_token_time", None)
    if arrival is not None and first is not None and first >= arrival:
        return float(first - arrival)
    return math.nan


def resolve_method(drafter_dir: str | Path | None, method: str | None) -> str | None:
    """The drafter method to serve: the one `drafter_dir` holds (read from its config.json), checked against
    `method` when both are given; "ngram" needs no drafter; None means speculation off."""
    if method is not None and method not in VLLM_METHODS:
        raise DraftsyncError(
            f"drafter method {method!r} is unknown to the vLLM backend",
            f"use one of {', '.join(VLLM_METHODS)}, or leave it unset to read it from the drafter",
        )
    if method == NGRAM.name:
        if drafter_dir is not None:
            raise DraftsyncError(
                f"a drafter directory ({drafter_dir}) was given with method {NGRAM.name!r}, which "
                "drafts from the prompt and loads no checkpoint",
                "pass drafter_dir=None for ngram, or the drafter's own method for the directory",
            )
        return NGRAM.name
    if drafter_dir is None:
        if method is not None:
            raise DraftsyncError(
                f"method {method!r} was given without a drafter directory",
                "pass the drafter's checkpoint directory, or no method to run the target alone",
            )
        return None
    from draftsync.speculative.drafters import drafter_method

    saved = drafter_method(drafter_dir)
    if saved not in VLLM_METHODS:
        raise DraftsyncError(
            f"drafter {drafter_dir} is a {saved!r} drafter, which the vLLM backend cannot run",
            f"use a drafter of one of {', '.join(CHECKPOINT_METHODS)}",
        )
    if method is not None and METHODS[method].vllm_method != METHODS[saved].vllm_method:
        raise DraftsyncError(
            f"method {method!r} was given for drafter {drafter_dir}, which holds a {saved!r} drafter",
            f"pass method={saved!r}, or leave it unset to read it from the drafter",
        )
    return saved


def proposable_tokens(method: str | None, drafter_dir: str | Path | None) -> int:
    """The most draft tokens a drafter proposes per step: a Medusa drafter's heads (vLLM fails to start when
    asked for more), chained drafters and ngram MAX_CHAIN_GAMMA, none without speculation."""
    if method is None:
        return 0
    if not METHODS[method].fixed_heads:
        return MAX_CHAIN_GAMMA
    from draftsync.speculative.checkpoint_files import read_json

    assert drafter_dir is not None, "a drafter with fixed heads is served from its directory"
    path, config = read_json(drafter_dir)
    heads = config.get("num_heads")
    if not isinstance(heads, int) or heads < 1:
        raise DraftsyncError(
            f"{path} gives no number of heads (num_heads={heads!r}) for its Medusa drafter",
            "re-save the drafter with save_drafter, which writes num_heads",
        )
    return heads


def speculative_config(
    target_dir: str | Path,
    method: str | None,
    drafter_dir: str | Path | None,
    gamma: int,
    tensor_parallel_size: int = 1,
    prompt_lookup_min: int | None = None,
    prompt_lookup_max: int | None = None,
) -> dict | None:
    """The `speculative_config` an `LLM` of `target_dir` gets for `gamma` draft tokens; None at gamma 0.

    EAGLE and Medusa drafters get the config `vllm serve` is launched with for the same pair (vllm_args.py),
    so the benchmark runs what is served, under the same limits (Medusa: gamma up to its heads). ngram gets
    its lookup window explicitly (vLLM would default both ends to 5).
    """
    gamma = int(gamma)
    if gamma < 0:
        raise DraftsyncError(f"gamma {gamma} is negative", "pass 0 (speculation off) or a number of draft tokens")
    if gamma == 0 or method is None:
        if gamma:
            raise DraftsyncError(
                f"gamma {gamma} was asked of a backend without a drafter",
                f"use gamma 0, or give the backend a drafter (or method {NGRAM.name!r})",
            )
        return None
    if method in TRAINED_METHODS:
        from draftsync.serving.vllm_args import render_vllm_command

        if drafter_dir is None:
            raise DraftsyncError(
                f"method {method!r} was given without a drafter directory", "pass the drafter's checkpoint directory"
            )
        # Only the speculative config of the launch is used; host, port and name do not enter it.
        launch = render_vllm_command(
            target_dir, drafter_dir, method, gamma, "127.0.0.1", 0, "evaluation", tensor_parallel_size
        )
        return launch.speculative_config
    if method == DRAFT_MODEL.name:
        config: dict[str, Any] = {
            "method": DRAFT_MODEL.vllm_method,
            "model": str(drafter_dir),
            "num_speculative_tokens": gamma,
        }
        if tensor_parallel_size > 1:
            config["draft_tensor_parallel_size"] = tensor_parallel_size
        return config
    if method == NGRAM.name:
        low, high = prompt_lookup_min, prompt_lookup_max
        if low is None and high is None:
            low = high = 5
        low = high if low is None else low
        high = low if high is None else high
        assert low is not None and high is not None, "one was given, or both are 5"
        if not 1 <= int(low) <= int(high):
            raise DraftsyncError(
                f"n-gram lookup lengths min={low}, max={high} are not 1 <= min <= max",
                "choose prompt_lookup_min >= 1 and prompt_lookup_max >= prompt_lookup_min",
            )
        return {
            "method": NGRAM.vllm_method,
            "num_speculative_tokens": gamma,
            "prompt_lookup_min": int(low),
            "prompt_lookup_max": int(high),
        }
    raise DraftsyncError(
        f"drafter method {method!r} is unknown to the vLLM backend", f"use one of {', '.join(VLLM_METHODS)}"
    )


class VllmBackend:
    """vLLM's offline engine as an `EvaluationBackend`: one `LLM` per gamma, built when first asked for.

    `method` None reads the drafter's method from its directory; "ngram" needs no directory. Extra
    keywords go to `LLM(...)` (dtype, gpu_memory_utilization, max_model_len, enforce_eager, ...).
    Building a new engine releases the previous one first, so one GPU holds one engine at a time, and
    warms the new one up. Switching gamma therefore costs an engine start: group calls by gamma.
    """

    name = "vllm"
    cheap_gamma_switch = False  # each gamma is its own LLM engine

    def __init__(
        self,
        target_dir: str | Path,
        drafter_dir: str | Path | None = None,
        method: str | None = None,
        tensor_parallel_size: int = 1,
        *,
        ignore_eos: bool = True,
        prompt_lookup_min: int | None = None,
        prompt_lookup_max: int | None = None,
        **llm_kwargs: Any,
    ):
        from draftsync.model_paths import confined_model_path

        self.target_dir = confined_model_path(target_dir, "target checkpoint")
        self.drafter_dir = confined_model_path(drafter_dir, "drafter checkpoint") if drafter_dir is not None else None
        if not (self.target_dir / "config.json").is_file():
            raise DraftsyncError(
                f"target {self.target_dir} has no config.json", "point at a saved checkpoint directory"
            )
        if int(tensor_parallel_size) < 1:
            raise DraftsyncError(
                f"tensor_parallel_size {tensor_parallel_size} is below 1", "pass the number of GPUs per engine"
            )
        self.llm_kwargs = llm_keywords(llm_kwargs)
        self.method = resolve_method(self.drafter_dir, method)
        self.tensor_parallel_size = int(tensor_parallel_size)
        self.ignore_eos = bool(ignore_eos)
        self.prompt_lookup = (prompt_lookup_min, prompt_lookup_max)
        if self.method == NGRAM.name:  # a bad lookup window fails here, not when the engine is built
            speculative_config(self.target_dir, NGRAM.name, None, 1, 1, *self.prompt_lookup)
        self.max_gamma = proposable_tokens(self.method, self.drafter_dir)
        if importlib.util.find_spec("vllm") is None:
            raise DraftsyncError(
                "vllm is not installed in this environment",
                "run the vLLM backend on a GPU worker with vllm installed, or use ReferenceBackend",
            )
        self._llm: Any = None
        self._llm_gamma: int | None = None
        self._tokenizer: Any = None

    @property
    def max_model_len(self) -> int:
        config = json.loads((self.target_dir / "config.json").read_text())
        return int(self.llm_kwargs.get("max_model_len") or config["max_position_embeddings"])

    def speculative_config(self, gamma: int) -> dict | None:
        """The `speculative_config` the engine for `gamma` is built with (for the record)."""
        if gamma > self.max_gamma:
            raise DraftsyncError(
                f"gamma {gamma} is more than this drafter proposes ({self.max_gamma})",
                f"use a gamma of at most {self.max_gamma}",
            )
        return speculative_config(
            self.target_dir, self.method, self.drafter_dir, gamma, self.tensor_parallel_size, *self.prompt_lookup
        )

    def llm(self, gamma: int) -> Any:
        """The engine for `gamma`, building it (and releasing the one before) when gamma changes."""
        config = self.speculative_config(gamma)
        if self._llm is not None and self._llm_gamma == gamma:
            return self._llm
        self._release()
        from vllm import LLM

        self._llm = LLM(
            model=str(self.target_dir),
            tensor_parallel_size=self.tensor_parallel_size,
            speculative_config=config,
            **self.llm_kwargs,
        )
        self._llm_gamma = gamma
        self._warm_up(self._llm)
        return self._llm

    def _warm_up(self, llm: Any) -> None:
        """One short request on a new engine, so kernels compiled on first use (sampling, rejection sampling)
        are not timed as part of the first measured request. Counters are read as deltas, so it counts nowhere."""
        from vllm import SamplingParams

        prompt = {"prompt_token_ids": self._token_ids(WARM_UP_PROMPT)}
        for temperature in (0.0, 1.0):  # greedy and sampled verification take different kernels
            params = SamplingParams(temperature=temperature, max_tokens=8, seed=0, ignore_eos=True)
            llm.generate([prompt], sampling_params=params, use_tqdm=False)

    def _token_ids(self, prompt: str) -> list[int]:
        """Tokenized as the reference backend does it, so both backends see the same prompt ids."""
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                str(self.target_dir), trust_remote_code=self.llm_kwargs["trust_remote_code"]
            )
        return list(self._tokenizer(prompt)["input_ids"])

    def generate(
        self, requests: Sequence[EvalRequest], gamma: int, temperature: float, seed: int
    ) -> list[RequestResult]:
        from vllm import SamplingParams

        llm = self.llm(gamma)
        results = []
        for index, request in enumerate(requests):
            ids = self._token_ids(request.prompt)
            params = SamplingParams(
                temperature=float(temperature),
                max_tokens=int(request.max_tokens),
                seed=int(seed) + index,
                ignore_eos=self.ignore_eos,
            )
            before = read_spec_decode_counts(llm.get_metrics())
            started = time.perf_counter()
            outputs = llm.generate([{"prompt_token_ids": ids}], sampling_params=params, use_tqdm=False)
            seconds = time.perf_counter() - started
            counts = read_spec_decode_counts(llm.get_metrics()).since(before)
            output = outputs[0]
            token_ids = list(output.outputs[0].token_ids)
            results.append(
                RequestResult(
                    index=index,
                    task=request.task,
                    prompt_tokens=len(ids),
                    output_tokens=len(token_ids),
                    drafts=counts.drafts,
                    draft_tokens=counts.draft_tokens,
                    accepted=counts.accepted,
                    accepted_per_position=_padded(counts.accepted_per_position, gamma),
                    seconds=seconds,
                    ttft_s=first_token_seconds(getattr(output, "metrics", None)),
                    token_ids=token_ids,
                )
            )
        return results

    def _release(self) -> None:
        """Shut the current engine down and give its GPU memory back before another is built."""
        llm, self._llm, self._llm_gamma = self._llm, None, None
        if llm is None:
            return
        engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(engine_core, "shutdown", None)
        if callable(shutdown):
            shutdown()  # stops the engine-core process now rather than at garbage collection
        del llm, engine_core, shutdown
        gc.collect()
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        except ImportError:
            cleanup_dist_env_and_memory = None
        if cleanup_dist_env_and_memory is not None:
            cleanup_dist_env_and_memory()
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def close(self) -> None:
        self._release()
