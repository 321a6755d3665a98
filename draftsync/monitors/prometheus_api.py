"""Read a deployment's spec-decode counters from a Prometheus server's HTTP API instead of its /metrics.

For teams that already run Prometheus: it scrapes vLLM, and draftsync asks it for the current counter values
with instant queries (`/api/v1/query`), summed over every series that matches the deployment's labels (engines,
replicas) and, for the per-position counter, kept apart by `position`. The result is the same
`SpecDecodeCounters` that `metrics.parse` reads from /metrics text, so the store takes deltas and sees counter
resets (restarts) the same way. All queries are evaluated at one instant, so the counters agree with each other.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from draftsync.errors import DraftsyncError
from draftsync.monitors.metrics import (
    ACCEPTED,
    ACCEPTED_PER_POSITION,
    DRAFT_TOKENS,
    DRAFTS,
    GENERATION_TOKENS,
    TPOT,
    SpecDecodeCounters,
    position_label,
)

LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
QUERY_PATH = "/api/v1/query"

# field of SpecDecodeCounters -> the series Prometheus stores (counters keep vLLM's `_total` suffix)
SERIES = {
    "drafts": f"{DRAFTS}_total",
    "draft_tokens": f"{DRAFT_TOKENS}_total",
    "accepted": f"{ACCEPTED}_total",
    "accepted_per_position": f"{ACCEPTED_PER_POSITION}_total",
    "generation_tokens": f"{GENERATION_TOKENS}_total",
    "tpot_sum": f"{TPOT}_sum",
    "tpot_count": f"{TPOT}_count",
}


def label_selector(labels: Mapping[str, str] | None) -> str:
    """`{job="chat",instance="10.0.0.5:8000"}` from exact label values (escaped), or "" for no labels."""
    if not labels:
        return ""
    matchers = []
    for name, value in sorted(labels.items()):
        if not LABEL_NAME.match(str(name)):
            raise DraftsyncError(
                f"Prometheus label name {name!r} is not valid",
                "use label names of letters, digits and '_' (not starting with a digit), e.g. job or instance",
            )
        escaped = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        matchers.append(f'{name}="{escaped}"')
    return "{" + ",".join(matchers) + "}"


def counter_queries(labels: Mapping[str, str] | None = None) -> dict[str, str]:
    """The PromQL instant query for each counter field: summed over the matching series (by position)."""
    selector = label_selector(labels)
    queries = {}
    for field_name, series in SERIES.items():
        by = " by (position)" if field_name == "accepted_per_position" else ""
        queries[field_name] = f"sum{by} ({series}{selector})"
    return queries


def _shown(url: str) -> str:
    """The URL without user and password, for messages."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, ""))


def query_counters(
    prometheus_url: str,
    labels: Mapping[str, str] | None = None,
    *,
    timeout: float = 5.0,
    at: float | None = None,
) -> SpecDecodeCounters:
    """The deployment's cumulative spec-decode counters as Prometheus has them now (or at unix time `at`).

    `labels` picks the deployment's series (e.g. {"job": "vllm-chat"}); absent counters read as zero, as
    in `metrics.parse`, but when not one series matches the error says so: the labels are likely wrong.
    """
    import httpx

    base = prometheus_url.rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise DraftsyncError(
            f"Prometheus URL {prometheus_url!r} is not an http(s) URL",
            "write it as http://HOST:9090 (the server's address, without /api/v1)",
        )
    shown = _shown(base)
    moment = time.time() if at is None else at
    queries = counter_queries(labels)
    results: dict[str, list[dict]] = {}
    with httpx.Client(timeout=timeout) as client:
        for field_name, query in queries.items():
            results[field_name] = _instant_query(client, base, shown, query, moment)

    if not any(results.values()):
        selector = label_selector(labels) or "(no labels)"
        raise DraftsyncError(
            f"Prometheus at {shown} has no vLLM series matching {selector}",
            "check the deployment's Prometheus labels (job, instance, ...) against the server's targets, and "
            "that Prometheus scrapes the vLLM endpoint",
        )

    def total(field_name: str) -> float | None:
        rows = results[field_name]
        return None if not rows else sum(_value(row, queries[field_name], shown) for row in rows)

    per_position: dict[int, float] = {}
    for row in results["accepted_per_position"]:
        position = position_label(row.get("metric", {}), f"Prometheus at {shown}")
        per_position[position] = per_position.get(position, 0.0) + _value(row, queries["accepted_per_position"], shown)
    positions: tuple[int, ...] = ()
    if per_position:
        positions = tuple(int(per_position.get(i, 0.0)) for i in range(max(per_position) + 1))

    def as_int(value: float | None) -> int | None:
        return None if value is None else int(round(value))

    return SpecDecodeCounters(
        drafts=as_int(total("drafts")) or 0,
        draft_tokens=as_int(total("draft_tokens")) or 0,
        accepted=as_int(total("accepted")) or 0,
        accepted_per_position=positions,
        generation_tokens=as_int(total("generation_tokens")),
        tpot_sum=total("tpot_sum"),
        tpot_count=as_int(total("tpot_count")),
    )


def _instant_query(client, base: str, shown: str, query: str, moment: float) -> list[dict]:
    """One `/api/v1/query`; the vector's rows (each `{"metric": {...}, "value": [ts, "v"]}`)."""
    import httpx

    try:
        response = client.get(f"{base}{QUERY_PATH}", params={"query": query, "time": f"{moment:.3f}"})
    except httpx.HTTPError as exc:
        raise DraftsyncError(
            f"Prometheus at {shown} is unreachable ({type(exc).__name__}: {exc})",
            "check that the Prometheus server runs and the deployment's Prometheus URL is right",
        ) from exc
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or "status" not in body:
        raise DraftsyncError(
            f"{shown}{QUERY_PATH} did not answer like a Prometheus server (HTTP {response.status_code})",
            "point the Prometheus URL at the server's root, e.g. http://HOST:9090, not at a /metrics endpoint",
        )
    if body["status"] != "success":
        raise DraftsyncError(
            f"Prometheus at {shown} refused the query {query!r}: {body.get('errorType', 'error')}: "
            f"{body.get('error', 'no detail')} (HTTP {response.status_code})",
            "check the deployment's Prometheus labels; label values are matched exactly",
        )
    data = body.get("data") or {}
    if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise DraftsyncError(
            f"Prometheus at {shown} answered {query!r} with a {data.get('resultType')!r} result, not a vector",
            "use a Prometheus-compatible server that answers instant queries with vectors (Prometheus, Thanos, "
            "Mimir, VictoriaMetrics)",
        )
    return data["result"]


def _value(row: dict, query: str, shown: str) -> float:
    try:
        value = float(row["value"][1])
    except (KeyError, IndexError, TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise DraftsyncError(
            f"Prometheus at {shown} gave {row.get('value')!r} for {query!r}, not a counter value",
            "check that the series are vLLM's counters (finite, never negative)",
        )
    return value
