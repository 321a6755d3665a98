"""Client traffic for the demo and smoke checks: real completions sent to a deployment's endpoint."""

from __future__ import annotations

import httpx
from prefect import task
from prefect.cache_policies import NONE

from draftsync.serving.completions import complete


def spec_decode_counts(completion: dict) -> dict:
    """A completion's own draft and accepted tokens and gamma (0 each with speculation off), as vLLM reports
    them with `--per-request-spec-decode-metrics` and the reference server always does."""
    stats = (completion.get("metrics") or {}).get("speculative_decoding") or {}
    return {
        "gamma": stats.get("num_spec_tokens", 0),
        "draft_tokens": stats.get("num_draft_tokens", 0),
        "accepted": stats.get("num_accepted_draft_tokens", 0),
    }


@task(name="send-traffic", cache_policy=NONE)
def send_traffic(
    endpoint: str,
    model: str,
    prompts: list[str],
    temperature: float,
    max_tokens: int,
    seed: int,
    domains: list[str] | None = None,
) -> dict:
    """POST each prompt to /v1/completions, labelled with its domain when given; returns token counts and the
    server's per-request stats."""
    completion_tokens, accepted, draft_tokens = 0, 0, 0
    with httpx.Client(base_url=endpoint, timeout=120) as client:
        for i, prompt in enumerate(prompts):
            domain = domains[i] if domains else None
            data = complete(client, model, prompt, max_tokens, temperature, seed + i, domain)
            completion_tokens += data["usage"]["completion_tokens"]
            stats = spec_decode_counts(data)
            accepted += stats["accepted"]
            draft_tokens += stats["draft_tokens"]
    return {
        "requests": len(prompts),
        "completion_tokens": completion_tokens,
        "accepted": accepted,
        "draft_tokens": draft_tokens,
    }
