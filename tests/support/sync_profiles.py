"""Sync profile files for tests that run `draftsync` as a separate process: the smallest sync that still trains,
registers, runs every gate and promotes (every threshold at zero, so a tiny drafter always passes)."""

from __future__ import annotations

import json

TINY_VALIDATION = {
    "backend": "reference",  # the tests that serve with vLLM ask for it
    "requests": 3,
    "max_tokens": 16,
    "gamma_range": [2, 3],
    "sweep_requests": 1,
    "min_acceptance": 0.0,
    "min_p50": 0.0,
    "min_p5": 0.0,
    "min_speedup": 0.0,
    "stress_requests": 2,
    "stress_concurrency": 2,
    "schedule_batch_sizes": [],
    "long_requests": 1,
    "long_max_tokens": 32,
    "min_long_acceptance": 0.0,
    "length_buckets": [0, 16, 32],
    "max_memory_overhead": 5.0,
}


def tiny_sync_profile(name: str, **overrides) -> str:
    """The profile as YAML text (JSON is YAML), for DRAFTSYNC_SYNC_PROFILE or `--profile FILE`."""
    profile = {
        "method": "eagle3",
        "train_steps": 40,
        "warm_start_steps": 20,
        "checkpoint_every": 20,
        "batch_size": 8,
        "seq_len": 64,
        "training_texts": 60,
        "generated_samples": 0,
        "validation": {"name": name, **TINY_VALIDATION},
        **overrides,
    }
    return json.dumps(profile, indent=2) + "\n"
