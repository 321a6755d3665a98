"""Stress at a multiple of normal QPS against served instances: speculation on, then off, same requests.

The seed's pre-go-live step 2: speculation must not degrade under concurrency. Requests arrive on a
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
from pathlib import Path

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


def stress_served_pair(
    server: str,
    target_dir: str,
    drafter_dir: str,
    gamma: int,
    requests: Sequence[EvalRequest],
    rate: float,
    concurrency: int,
    temperature: float,
    seed: int,
    log_dir: Path,
    batch_sizes: Sequence[int] = (),
) -> dict:
    """Serve the pair (`server`: "reference" for the CPU reference server, "vllm" for `vllm serve`), drive the
    load; again without the drafter; compare.

    With `batch_sizes`, each server also runs closed-loop load at each of those concurrencies (as fast as it
    answers): on vLLM, whose continuous batching runs every request in flight together, concurrency c is a
    decode batch of c, and the figures give `speculation_schedule` its data (gamma vs plain per batch size).
    The reference server answers one request at a time, so there the levels measure queueing, not batching."""
    from draftsync.serving.process import ServerProcess, free_port
    from draftsync.serving.reference_server import reference_server_command
    from draftsync.serving.vllm_args import render_vllm_command
    from draftsync.serving.vllm_engine import find_vllm_engine, start_vllm_server, wait_until_serving
    from draftsync.speculative.drafters import drafter_method

    engine = find_vllm_engine() if server == "vllm" else None
    method = drafter_method(drafter_dir)

    def launch(mode: str, drafter: str | None, schedule: list | None = None) -> ServerProcess:
        port = free_port()
        log = log_dir / f"stress-{mode}-{port}.log"
        if engine is not None:
            argv = render_vllm_command(
                target_dir, drafter, method if drafter else None, gamma, "127.0.0.1", port, "stress", schedule=schedule
            ).argv
            return start_vllm_server(engine, argv, "127.0.0.1", port, log)
        argv = reference_server_command(target_dir, drafter, gamma, "127.0.0.1", port, "stress")
        return ServerProcess(argv, "127.0.0.1", port, log, env={"DRAFTSYNC_TORCH_THREADS": "1"}).start()

    def closed_loop(process: ServerProcess, size: int) -> dict:
        closed = [requests[i % len(requests)] for i in range(max(len(requests), 2 * size))]
        return drive_load(process.url, "stress", closed, math.inf, size, temperature, seed)

    def load(mode: str, process: ServerProcess) -> None:
        if engine is not None:
            wait_until_serving(process, f"stress ({mode})")
        else:
            process.wait_healthy(timeout=180)
        runs[mode] = drive_load(process.url, "stress", requests, rate, concurrency, temperature, seed)
        for size in batch_sizes:
            runs.setdefault("by_batch_size", {}).setdefault(size, {})[mode] = closed_loop(process, size)

    runs: dict = {}
    pairs = (("speculative", drafter_dir), ("plain", None))
    if server == "vllm":  # one GPU: one engine at a time
        for mode, drafter in pairs:
            with launch(mode, drafter) as process:
                load(mode, process)
    else:  # CPU reference servers load at the same time (seconds saved), then take turns under load
        processes = {}
        try:
            for mode, drafter in pairs:
                processes[mode] = launch(mode, drafter)
            for mode, process in processes.items():
                load(mode, process)
        finally:
            for process in processes.values():
                process.stop()
    spec, plain = runs["speculative"]["ms_per_token"], runs["plain"]["ms_per_token"]
    result = {
        "speculative": runs["speculative"],
        "plain": runs["plain"],
        "errors": runs["speculative"]["errors"] + runs["plain"]["errors"],
        "speedup": plain / spec if spec and plain else None,
    }
    if batch_sizes:
        from draftsync.validation.checklist import speculation_schedule

        by_size = runs["by_batch_size"]
        result["by_batch_size"] = by_size
        result["errors"] += sum(level["errors"] for modes in by_size.values() for level in modes.values())
        measured = {
            size: {0: modes["plain"]["ms_per_token"], gamma: modes["speculative"]["ms_per_token"]}
            for size, modes in by_size.items()
            if modes["plain"]["ms_per_token"] and modes["speculative"]["ms_per_token"]
        }
        result["schedule"] = speculation_schedule(measured) if measured else None
        if engine is not None and result["schedule"]:
            # vLLM picks k per decode batch from the schedule: relaunched with it, the pair must be no slower than
            # plain decoding at any measured concurrency (what the schedule promises).
            with launch("scheduled", drafter_dir, result["schedule"]) as process:
                wait_until_serving(process, "stress (scheduled)")
                levels = {size: closed_loop(process, size) for size in batch_sizes}
            result["errors"] += sum(level["errors"] for level in levels.values())
            result["schedule_check"] = {
                size: {
                    "scheduled_ms_per_token": level["ms_per_token"],
                    "plain_ms_per_token": by_size[size]["plain"]["ms_per_token"],
                    "speedup": by_size[size]["plain"]["ms_per_token"] / level["ms_per_token"]
                    if level["ms_per_token"] and by_size[size]["plain"]["ms_per_token"]
                    else None,
                }
                for size, level in levels.items()
            }
    return result
