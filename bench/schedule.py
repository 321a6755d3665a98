"""vLLM's per-batch-size speculation schedule against plain decoding: three servers up at once, loaded in turns.

The checklist derives `num_speculative_tokens_per_batch_size` from stress levels of eight requests each and relaunches
the pair with it once (`stress.schedule_check`); that is too little load to tell a few percent from noise on two
cores. Here the same pair is served three ways at once: the target alone (plain), the pair at `--gamma` at every
batch size (speculative), and the pair with the schedule (scheduled). Each round loads every server closed-loop at
each concurrency in turn, so a drift in the machine's load moves all three alike; figures are medians over rounds,
in milliseconds per output token, and the ratios plain / scheduled and plain / speculative are the speedups.

The schedule is the one the checklist measured (`--schedule` "first,last,k;..."; by default derived here from this
run's own plain and speculative figures, as `stress_comparison` derives it). Where it says k = 0, vLLM still runs
the drafter's first forward pass every step to keep the drafter's KV cache in step with the target's (vLLM 0.32,
vllm/v1/spec_decode/llm_base_proposer.py: "No draft tokens requested (e.g. Dynamic SD decided K=0)"), and the target
still returns its auxiliary hidden states, so a k = 0 step is not a plain step: the scheduled/plain ratio at those
concurrencies is that cost.

Usage: python bench/schedule.py --target DIR --drafter DIR [--gamma 2] [--schedule "1,1,2;2,8,0"]
       [--concurrency 1,2,4,8] [--requests 24] [--max-tokens 48] [--rounds 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import emit_json, machine_facts  # noqa: E402

MIX = {"code": 0.5, "math": 0.5}


def parse_schedule(text: str) -> list[tuple[int, int, int]]:
    return [tuple(int(x) for x in part.split(",")) for part in text.split(";") if part.strip()]  # type: ignore[misc]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=Path, required=True, help="the target's checkpoint directory")
    parser.add_argument("--drafter", type=Path, required=True, help="the drafter's checkpoint directory")
    parser.add_argument("--gamma", type=int, default=2, help="speculative tokens where the schedule speculates")
    parser.add_argument("--schedule", help='"first,last,k;..." (default: derived from this run\'s figures)')
    parser.add_argument("--concurrency", default="1,2,4,8", help="closed-loop clients, comma-separated")
    parser.add_argument("--requests", type=int, default=24, help="requests per level (at least 2x the clients)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args()
    load_at_start = round(os.getloadavg()[0], 2)

    from draftsync.serving.evaluation import SERVED_NAME
    from draftsync.serving.vllm_evaluation import VllmBackend
    from draftsync.validation.checklist import schedule_k, speculation_schedule
    from draftsync.validation.runner import validation_requests
    from draftsync.validation.stress import StressLoad

    levels = tuple(int(c) for c in args.concurrency.split(","))
    load = StressLoad(tuple(validation_requests(MIX, args.requests, args.max_tokens, seed=11)), 0.0, 1, 0.0, 0, levels)
    logs = Path(tempfile.mkdtemp(prefix="draftsync-schedule-"))
    backends = {
        "plain": (VllmBackend(args.target, log_dir=logs), 0, None),
        "speculative": (VllmBackend(args.target, args.drafter, log_dir=logs), args.gamma, None),
    }
    runs: dict[str, list[dict[int, dict]]] = {name: [] for name in ("plain", "speculative", "scheduled")}
    try:
        endpoints = {name: backend.endpoint(gamma, schedule) for name, (backend, gamma, schedule) in backends.items()}

        def round_of(names):
            for name in names:
                runs[name].append(load.levels(endpoints[name], SERVED_NAME))

        round_of(("plain", "speculative"))  # a first round to derive the schedule from when none is given
        schedule = parse_schedule(args.schedule) if args.schedule else None
        if schedule is None:
            measured = {
                size: {
                    0: runs["plain"][0][size]["ms_per_token"],
                    args.gamma: runs["speculative"][0][size]["ms_per_token"],
                }
                for size in levels
            }
            schedule = speculation_schedule(measured)
        backends["scheduled"] = (VllmBackend(args.target, args.drafter, log_dir=logs), args.gamma, schedule)
        endpoints["scheduled"] = backends["scheduled"][0].endpoint(args.gamma, schedule)
        runs["plain"].clear()
        runs["speculative"].clear()
        for _ in range(args.rounds):
            round_of(("plain", "speculative", "scheduled"))
            print(f"round {len(runs['plain'])} of {args.rounds} done", file=sys.stderr)
    finally:
        for backend, _, _ in backends.values():
            backend.close()

    def median_ms(name: str, size: int) -> float:
        return statistics.median(run[size]["ms_per_token"] for run in runs[name])

    table = {}
    for size in levels:
        plain, spec, scheduled = (median_ms(name, size) for name in ("plain", "speculative", "scheduled"))
        table[str(size)] = {
            "k_scheduled": schedule_k(schedule, size),
            "plain_ms_per_token": round(plain, 3),
            "speculative_ms_per_token": round(spec, 3),
            "scheduled_ms_per_token": round(scheduled, 3),
            "speculative_speedup": round(plain / spec, 3),
            "scheduled_speedup": round(plain / scheduled, 3),
            "scheduled_spread": [round(plain / run[size]["ms_per_token"], 3) for run in runs["scheduled"]],
            "errors": sum(run[size]["errors"] for name in runs for run in runs[name]),
        }
    out = {
        "benchmark": "schedule",
        "target": str(args.target),
        "drafter": str(args.drafter),
        "gamma": args.gamma,
        "schedule": [list(entry) for entry in schedule],
        "requests_per_level": args.requests,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "by_concurrency": table,
        "machine": machine_facts(load_at_start, ("torch",)),
    }
    emit_json(out, args.json, sys.stdout)


if __name__ == "__main__":
    main()
