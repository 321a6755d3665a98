"""The target's own responses written by vLLM and by the Hugging Face loop: the same prompts, one run, one machine.

A dataset build answers `generated_samples` prompts with the target (bench figures decide which writer a profile
pins). Here the built-in target v1 answers prompts drawn as `build_dataset` draws them, first by
`generate_responses` (transformers' `generate`, 32 prompts a batch, as the build runs it), then by one plain vLLM
server (`VllmResponseWriter`, `--in-flight` requests at a time). Reported: samples/s and response tokens/s of both;
vLLM's server start (to /health) and stop apart, and an end-to-end figure that counts them; at T=0, the share of
prompts whose greedy response is the same from both, and where the others first differ.

Usage: python bench/responses.py [--size test|demo] [--prompts N] [--max-tokens N] [--in-flight N]
       [--temperature T] [--json PATH] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from acceptance import quiet_offline_environment  # noqa: E402
from harness import emit_json, machine_facts  # noqa: E402

MIX = {"code": 0.5, "math": 0.5}  # target v1's task mix
HF_BATCH = 32  # regenerated_samples' batch size: the loop as a build runs it


def figures(samples: list[tuple[list[int], list[int]]], seconds: float) -> dict:
    tokens = sum(sum(mask) for _, mask in samples)
    return {
        "seconds": round(seconds, 2),
        "samples_per_s": round(len(samples) / seconds, 2),
        "response_tokens": tokens,
        "response_tokens_per_s": round(tokens / seconds, 1),
    }


def first_difference(a: list[int], b: list[int]) -> int:
    """The first position where two responses differ (the shorter one's length when one extends the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("test", "demo"), default="demo", help="built-in target size")
    parser.add_argument("--prompts", type=int, default=400, help="prompts answered (the demo profile's 400)")
    parser.add_argument("--max-tokens", type=int, default=96, help="response length cap (the demo profile's 96)")
    parser.add_argument("--in-flight", type=int, help="requests vLLM is sent at a time (default: the writer's)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy, and the outputs are compared")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument("--workdir", type=Path, help="where the target is cached (default: a temporary directory)")
    args = parser.parse_args()
    quiet_offline_environment()
    load_at_start = round(os.getloadavg()[0], 2)

    from draftsync.serving.vllm_engine import find_vllm_engine
    from draftsync.serving.vllm_responses import IN_FLIGHT, VllmResponseWriter
    from draftsync.speculative.builtin.targets import build_target, builtin_recipe
    from draftsync.speculative.data.corpora import task_prompts_for_mix
    from draftsync.speculative.data.responses import generate_responses
    from draftsync.speculative.targets import load_target

    engine = find_vllm_engine()  # no engine, no comparison: fail before the long part
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="draftsync-responses-"))
    workdir.mkdir(parents=True, exist_ok=True)
    targets = workdir / "targets"
    # vLLM serves only checkpoints inside a model root (model_paths.py): this run's targets are one.
    os.environ["DRAFTSYNC_MODEL_ROOTS"] = os.pathsep.join(
        filter(None, (os.environ.get("DRAFTSYNC_MODEL_ROOTS"), str(targets)))
    )
    started = time.perf_counter()
    target_dir = build_target(builtin_recipe(1, args.size), targets)
    model, tokenizer = load_target(target_dir)
    target_seconds = time.perf_counter() - started
    prompts = [prompt for _, prompt in task_prompts_for_mix(MIX, args.prompts, seed=100, split="train")]

    clock = time.perf_counter()
    ids, masks = generate_responses(
        model, tokenizer, prompts, args.max_tokens, batch_size=HF_BATCH, temperature=args.temperature
    )
    hf = list(zip(ids, masks, strict=True))
    hf_seconds = time.perf_counter() - clock
    print(f"hf: {len(hf)} responses in {hf_seconds:.1f} s", file=sys.stderr)

    clock = time.perf_counter()
    in_flight = args.in_flight or IN_FLIGHT
    writer = VllmResponseWriter(target_dir, workdir / "logs", in_flight=in_flight, engine=engine)
    with writer:
        start_seconds = time.perf_counter() - clock
        clock = time.perf_counter()
        vllm = list(writer.responses(tokenizer, prompts, args.max_tokens, temperature=args.temperature))
        generate_seconds = time.perf_counter() - clock
        clock = time.perf_counter()
    stop_seconds = time.perf_counter() - clock
    print(
        f"vllm: {len(vllm)} responses in {generate_seconds:.1f} s after a {start_seconds:.1f} s start", file=sys.stderr
    )

    comparison = None
    if args.temperature == 0:
        # positions counted in the response: the prompt is len(ids) - sum(mask) tokens, the same for both
        differing = [
            first_difference(a, b) - (len(a) - sum(mask)) for (a, mask), (b, _) in zip(hf, vllm, strict=True) if a != b
        ]
        comparison = {
            "greedy_equal_share": round(1 - len(differing) / len(prompts), 4),
            "differing": len(differing),
            "first_difference_in_response_at": sorted(differing),
        }
    end_to_end = start_seconds + generate_seconds + stop_seconds
    out = {
        "benchmark": "responses",
        "target_size": args.size,
        "prompts": len(prompts),
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "hf": {**figures(hf, hf_seconds), "batch_size": HF_BATCH},
        "vllm": {
            **figures(vllm, generate_seconds),
            "in_flight": in_flight,
            "server_start_s": round(start_seconds, 2),
            "server_stop_s": round(stop_seconds, 2),
            "end_to_end": figures(vllm, end_to_end),
        },
        "vllm_end_to_end_speedup": round(hf_seconds / end_to_end, 3),
        "comparison": comparison,
        "target_s": round(target_seconds, 1),
        "vllm_engine": {"source": engine.source, "device": engine.device, "version": engine.version()},
        "machine": machine_facts(load_at_start, ("torch", "transformers")),
    }
    emit_json(out, args.json, sys.stdout)


if __name__ == "__main__":
    main()
