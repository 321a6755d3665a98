"""Real completions sent to a server or a deployment's router: one request, a candidate's smoke check, and the wall
time per output token a client sees. Plain HTTP, so the serving service runs them as the flows do."""

from __future__ import annotations

import time

import httpx

from draftsync.errors import DraftsyncError
from draftsync.serving.traffic_capture import DOMAIN_HEADER

SMOKE_ATTEMPTS = 3  # a fresh server may drop its very first connection


def complete(
    client: httpx.Client,
    model: str,
    prompt: str,
    max_tokens: int,
    temperature: float,
    seed: int | None = None,
    domain: str | None = None,
) -> dict:
    """One /v1/completions call; any answer but 200 is an error that points at the server log. `domain`: the
    client's label for the request's kind of traffic (the router's capture keeps it)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    response = client.post("/v1/completions", json=body, headers={DOMAIN_HEADER: domain} if domain else None)
    if response.status_code != 200:
        raise DraftsyncError(
            f"{client.base_url} answered {response.status_code}: {response.text[:200]}",
            "see the server log under <workdir>/serving",
        )
    return response.json()


def smoke(endpoint: str, model: str, prompts: list[str], max_tokens: int = 8) -> int:
    """Each prompt answered at temperature 0 before any traffic moves to the server; the completion tokens."""
    tokens = 0
    with httpx.Client(base_url=endpoint, timeout=120) as client:
        for prompt in prompts:
            for attempt in range(SMOKE_ATTEMPTS):
                try:
                    tokens += complete(client, model, prompt, max_tokens, temperature=0.0)["usage"]["completion_tokens"]
                    break
                except (httpx.TransportError, DraftsyncError):
                    if attempt == SMOKE_ATTEMPTS - 1:
                        raise
                    time.sleep(2)
    return tokens


def ms_per_token(endpoint: str, model: str, prompts: list[str], max_tokens: int, temperature: float) -> float | None:
    """Wall time per output token over a few sequential requests: what a client sees, prefill included."""
    with httpx.Client(base_url=endpoint, timeout=300) as client:
        started, tokens = time.perf_counter(), 0
        for i, prompt in enumerate(prompts):
            tokens += complete(client, model, prompt, max_tokens, temperature, seed=i)["usage"]["completion_tokens"]
        return 1000.0 * (time.perf_counter() - started) / tokens if tokens else None
