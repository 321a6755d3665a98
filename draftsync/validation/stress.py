"""Stress at a multiple of normal QPS against served instances: speculation on, then off, same requests.

The served instances are the evaluation backend's own (`EvaluationBackend.endpoint`: vLLM servers, or the CPU
reference server), so on vLLM stress reuses the servers the checklist has up anyway.

The production guide's pre-go-live step 2: speculation must not degrade under concurrency. Requests arrive on a
fixed schedule (stress_factor x qps) whether or not earlier ones have finished, up to `concurrency`
clients in flight; each request's latency counts from its scheduled arrival, so queueing on an
overloaded server is part of what is measured. The figure compared is end-to-end milliseconds per
output token (latency / completion tokens), with and without speculation, and every non-200 answer
or transport failure is an error.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from draftsync.serving.evaluation import EvalRequest


def drive_load(
    endpoint: str,
    model: str,
    requests: Sequence[EvalRequest],
    rate: float,
    concurrency: int,
    temperature: float,
    seed: int,
    timeout: float = 600.0,
) -> dict:
    """Send `requests` at `rate` per second with at most `concurrency` in flight; latency per token and errors."""
    import httpx

    started = time.perf_counter()
    with httpx.Client(base_url=endpoint, timeout=timeout, limits=httpx.Limits(max_connections=concurrency)) as client:

        def one(index: int, request: EvalRequest) -> dict:
            if math.isfinite(rate):  # open loop: the request arrives on schedule, waiting counts
                arrival = started + index / rate
                delay = arrival - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)
            else:  # closed loop: each request leaves as soon as a client is free
                arrival = time.perf_counter()
            body = {
                "model": model,
                "prompt": request.prompt,
                "max_tokens": request.max_tokens,
                "temperature": temperature,
                "seed": seed + index,
            }
            try:
                response = client.post("/v1/completions", json=body)
            except httpx.HTTPError as error:
                return {"error": f"{type(error).__name__}: {error}"}
            latency = time.perf_counter() - arrival
            if response.status_code != 200:
                return {"error": f"HTTP {response.status_code}: {response.text[:200]}"}
            return {"latency_s": latency, "tokens": int(response.json()["usage"]["completion_tokens"])}

        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            outcomes = list(pool.map(one, range(len(requests)), requests))
    done = [o for o in outcomes if "error" not in o]
    tokens = sum(o["tokens"] for o in done)
    errors = [o["error"] for o in outcomes if "error" in o]
    return {
        "requests": len(requests),
        "errors": len(errors),
        "error_examples": errors[:3],
        "rate_per_s": rate,
        "concurrency": concurrency,
        "completion_tokens": tokens,
        "ms_per_token": 1000.0 * sum(o["latency_s"] for o in done) / tokens if tokens else None,
        "seconds": round(time.perf_counter() - started, 2),
    }


@dataclass(frozen=True)
class StressLoad:
    """The load stress puts on one served instance: `requests` arriving at `rate` per second with at most
    `concurrency` in flight, then closed-loop load at each of `batch_sizes` (as fast as it answers: on vLLM, whose
    continuous batching runs every request in flight together, concurrency c is a decode batch of c)."""

    requests: tuple[EvalRequest, ...]
    rate: float
    concurrency: int
    temperature: float
    seed: int
    batch_sizes: tuple[int, ...] = ()

    def levels(self, endpoint: str, model: str) -> dict[int, dict]:
        """Closed-loop load at each batch size, at least twice as many requests as clients."""
        requests = self.requests
        return {
            size: drive_load(
                endpoint,
                model,
                [requests[i % len(requests)] for i in range(max(len(requests), 2 * size))],
                math.inf,
                size,
                self.temperature,
                self.seed,
            )
            for size in self.batch_sizes
        }

    def run(self, endpoint: str, model: str) -> dict:
        """The open-loop run, then the closed-loop levels, against one served instance."""
        opened = drive_load(endpoint, model, self.requests, self.rate, self.concurrency, self.temperature, self.seed)
        return {**opened, "by_batch_size": self.levels(endpoint, model)}


def stress_comparison(speculative: dict, plain: dict, gamma: int) -> dict:
    """Speculative against plain under the same load: the speedup, every error, and where the levels were measured,
    vLLM's per-batch-size schedule (gamma where it was faster, 0 where plain decoding was)."""
    from draftsync.validation.checklist import speculation_schedule

    runs = {
        mode: {k: v for k, v in run.items() if k != "by_batch_size"}
        for mode, run in (("speculative", speculative), ("plain", plain))
    }
    spec_ms, plain_ms = runs["speculative"]["ms_per_token"], runs["plain"]["ms_per_token"]
    result: dict = {
        **runs,
        "errors": runs["speculative"]["errors"] + runs["plain"]["errors"],
        "speedup": plain_ms / spec_ms if spec_ms and plain_ms else None,
    }
    sizes = sorted(speculative.get("by_batch_size") or {})
    if sizes:
        by_size = {
            size: {"speculative": speculative["by_batch_size"][size], "plain": plain["by_batch_size"][size]}
            for size in sizes
        }
        result["by_batch_size"] = by_size
        result["errors"] += sum(level["errors"] for modes in by_size.values() for level in modes.values())
        measured = {
            size: {0: modes["plain"]["ms_per_token"], gamma: modes["speculative"]["ms_per_token"]}
            for size, modes in by_size.items()
            if modes["plain"]["ms_per_token"] and modes["speculative"]["ms_per_token"]
        }
        result["schedule"] = speculation_schedule(measured) if measured else None
    return result


def schedule_check(result: dict, scheduled: dict[int, dict], gamma: int) -> dict:
    """The pair relaunched with its measured schedule, loaded at each concurrency again, against plain decoding
    there: whether vLLM's per-batch choice does what the schedule says (no slower than plain anywhere).

    On vLLM a k = 0 step is not a plain step: the drafter still runs its first forward pass to keep its KV cache in
    step (vLLM 0.32, llm_base_proposer.py), and the target still returns its auxiliary hidden states. Where the
    relaunched pair at k = 0 was slower than the pair speculating at `gamma` under the same load, the schedule is
    revised to `gamma` there (`schedule_measured` keeps the first one, `schedule_note` says where and why): every k
    in the revised schedule is the faster of the two as measured."""
    from draftsync.validation.checklist import schedule_k, schedule_ranges

    by_size = result["by_batch_size"]
    measured_schedule = result["schedule"]
    check = {}
    k_by_size = {}
    revised_at = []
    for size, level in scheduled.items():
        plain_ms, scheduled_ms = by_size[size]["plain"]["ms_per_token"], level["ms_per_token"]
        spec_ms = by_size[size]["speculative"]["ms_per_token"]
        k = schedule_k(measured_schedule, size)
        check[size] = {
            "k": k,
            "scheduled_ms_per_token": scheduled_ms,
            "plain_ms_per_token": plain_ms,
            "speculative_ms_per_token": spec_ms,
            "speedup": plain_ms / scheduled_ms if plain_ms and scheduled_ms else None,
            "errors": level["errors"],
        }
        if k == 0 and scheduled_ms and spec_ms and scheduled_ms > spec_ms:
            revised_at.append(size)
            k = gamma
        k_by_size[size] = k
    out = {
        **result,
        "schedule_check": check,
        "errors": result["errors"] + sum(level["errors"] for level in scheduled.values()),
    }
    if revised_at:
        out["schedule_measured"] = measured_schedule
        out["schedule"] = schedule_ranges(k_by_size)
        out["schedule_note"] = (
            f"k = 0 was slower than speculating at gamma {gamma} at concurrency {', '.join(map(str, revised_at))}: "
            "vLLM still runs the drafter's first pass at k = 0, so the schedule speculates there"
        )
    return out
