"""vLLM's speculative-decoding counters: scrape `/metrics`, parse them, and take deltas between scrapes.

Counters are summed across labels other than `position` (model_name, engine, ...), so a server with
several engines reads as one deployment. A counter that goes down means the server restarted.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass, field, fields, replace

from draftsync.errors import DraftsyncError

DRAFTS = "vllm:spec_decode_num_drafts"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
TPOT = "vllm:time_per_output_token_seconds"
_COUNTED = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POSITION, GENERATION_TOKENS)


@dataclass(frozen=True)
class SpecDecodeCounters:
    """Cumulative counters of one scrape (or the difference between two scrapes).

    `accepted_per_position[i]` counts drafts whose token at position i (0-based) was accepted.
    The optional fields are None when the server does not export them.
    """

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: tuple[int, ...] = ()
    generation_tokens: int | None = None
    tpot_sum: float | None = None
    tpot_count: int | None = None

    def to_dict(self) -> dict:
        """JSON-ready form, used to keep the last raw counters in the store."""
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["accepted_per_position"] = list(self.accepted_per_position)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> SpecDecodeCounters:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["accepted_per_position"] = tuple(values.get("accepted_per_position") or ())
        return cls(**values)


@dataclass
class _Totals:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_position: dict[int, float] = field(default_factory=dict)
    generation_tokens: float | None = None
    tpot_sum: float | None = None
    tpot_count: float | None = None


def _base_name(sample_name: str) -> str:
    """The counter's name without `_total`: the parser strips it from typed families, not from untyped ones."""
    return sample_name[: -len("_total")] if sample_name.endswith("_total") else sample_name


def _add(current: float | None, value: float) -> float:
    return value if current is None else current + value


# Counts above 2**53 cannot be exact in Prometheus' float64 text; no server gets there, so such a value is garbage.
MAX_COUNTER_VALUE = 2**53
# vLLM has one per-position series per speculative token; far more positions than any gamma means garbage.
MAX_POSITIONS = 1024


def _checked_value(name: str, value: float, source: str) -> float:
    """A counter's value, refused with a DraftsyncError when no server could have exported it."""
    if not math.isfinite(value) or value < 0 or value > MAX_COUNTER_VALUE:
        raise DraftsyncError(
            f"{source}: {name} has the value {value!r}, which no counter can have (it must be finite, "
            f">= 0 and <= 2**53)",
            "check that the endpoint is a vLLM (or draftsync reference) server and not a proxy rewriting its "
            "metrics; nothing from this scrape was stored",
        )
    return value


def parse(text: str, source: str = "metrics text") -> SpecDecodeCounters:
    """Read the spec-decode counters from Prometheus text; series that are absent read as zero.

    `source` names where the text came from (an endpoint URL), for the error message. A value that is
    not finite, negative or beyond 2**53 is refused, so garbage never reaches the store.
    """
    from prometheus_client.parser import text_string_to_metric_families

    totals = _Totals()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                name = sample.name
                if name.endswith("_created"):
                    continue
                base = _base_name(name)
                if base in _COUNTED or name in (f"{TPOT}_sum", f"{TPOT}_count"):
                    _checked_value(name, sample.value, source)
                if base == DRAFTS:
                    totals.drafts += sample.value
                elif base == DRAFT_TOKENS:
                    totals.draft_tokens += sample.value
                elif base == ACCEPTED:
                    totals.accepted += sample.value
                elif base == ACCEPTED_PER_POSITION:
                    position = position_label(sample.labels, source)
                    totals.per_position[position] = totals.per_position.get(position, 0.0) + sample.value
                elif base == GENERATION_TOKENS:
                    totals.generation_tokens = _add(totals.generation_tokens, sample.value)
                elif name == f"{TPOT}_sum":
                    totals.tpot_sum = _add(totals.tpot_sum, sample.value)
                elif name == f"{TPOT}_count":
                    totals.tpot_count = _add(totals.tpot_count, sample.value)
    except ValueError as exc:
        raise DraftsyncError(
            f"{source} did not return Prometheus text ({exc})",
            "point the scraper at the server's /metrics endpoint (vLLM or the draftsync reference server)",
        ) from exc

    per_position: tuple[int, ...] = ()
    if totals.per_position:
        length = max(totals.per_position) + 1
        per_position = tuple(int(totals.per_position.get(i, 0.0)) for i in range(length))
    return SpecDecodeCounters(
        drafts=int(totals.drafts),
        draft_tokens=int(totals.draft_tokens),
        accepted=int(totals.accepted),
        accepted_per_position=per_position,
        generation_tokens=None if totals.generation_tokens is None else int(totals.generation_tokens),
        tpot_sum=totals.tpot_sum,
        tpot_count=None if totals.tpot_count is None else int(totals.tpot_count),
    )


def position_label(labels: dict[str, str], source: str) -> int:
    """The `position` label of a per-position series, as a non-negative int; an error names `source`."""
    raw = labels.get("position")
    try:
        position = int(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        position = -1
    if position < 0 or position >= MAX_POSITIONS:
        raise DraftsyncError(
            f"{source}: {ACCEPTED_PER_POSITION} has a series with position={raw!r}",
            f"the per-position counter needs an integer `position` label from 0 to {MAX_POSITIONS - 1}; "
            "check the server version",
        )
    return position


def _pad(values: tuple[int, ...], length: int) -> tuple[int, ...]:
    return values + (0,) * (length - len(values))


def delta(previous: SpecDecodeCounters, current: SpecDecodeCounters) -> tuple[SpecDecodeCounters, bool]:
    """What happened between two scrapes, and whether the server restarted in between.

    Any counter going down means a restart: counting began again from zero, so the delta is the
    current value (never negative). Traffic between the last scrape and the restart is lost.
    """
    length = max(len(previous.accepted_per_position), len(current.accepted_per_position))
    prev_pos = _pad(previous.accepted_per_position, length)
    cur_pos = _pad(current.accepted_per_position, length)
    pairs: list[tuple[float | None, float | None]] = [
        (previous.drafts, current.drafts),
        (previous.draft_tokens, current.draft_tokens),
        (previous.accepted, current.accepted),
        (previous.generation_tokens, current.generation_tokens),
        (previous.tpot_sum, current.tpot_sum),
        (previous.tpot_count, current.tpot_count),
        *zip(prev_pos, cur_pos, strict=True),
    ]
    reset = any(p is not None and c is not None and c < p for p, c in pairs)
    if reset:
        return current, True

    def minus(cur, prev):
        if cur is None:
            return None
        return cur - (prev or 0)

    return (
        replace(
            current,
            drafts=current.drafts - previous.drafts,
            draft_tokens=current.draft_tokens - previous.draft_tokens,
            accepted=current.accepted - previous.accepted,
            accepted_per_position=tuple(c - p for p, c in zip(prev_pos, cur_pos, strict=True)),
            generation_tokens=minus(current.generation_tokens, previous.generation_tokens),
            tpot_sum=minus(current.tpot_sum, previous.tpot_sum),
            tpot_count=minus(current.tpot_count, previous.tpot_count),
        ),
        False,
    )


# Idle connections kept open to /metrics endpoints between scrapes (more endpoints reconnect each cycle).
SCRAPE_KEEPALIVE = 64


@functools.cache
def _http_client(process_id: int):
    """One HTTP client per process, shared by the scrape threads (httpx clients are thread-safe).

    Building a client loads the CA bundle, about 25 ms of CPU: `httpx.get` did it on every scrape, which was
    more than half of a 200-endpoint cycle. Keyed by process id, so a forked worker builds its own."""
    import httpx

    return httpx.Client(limits=httpx.Limits(max_connections=None, max_keepalive_connections=SCRAPE_KEEPALIVE))


def scrape(url: str, timeout: float = 5.0) -> str:
    """GET a `/metrics` endpoint and return its text."""
    import httpx

    try:
        response = _http_client(os.getpid()).get(url, timeout=timeout)
    except httpx.HTTPError as exc:
        raise DraftsyncError(
            f"metrics endpoint {url} is unreachable ({type(exc).__name__}: {exc})",
            "check that the server is running and the deployment's endpoint URL is right",
        ) from exc
    if response.status_code != 200:
        raise DraftsyncError(
            f"metrics endpoint {url} answered HTTP {response.status_code}",
            "point the scraper at the server's /metrics path; vLLM serves it on the API port",
        )
    return response.text


def scrape_counters(url: str, timeout: float = 5.0) -> SpecDecodeCounters:
    """Scrape and parse in one step; errors name the endpoint."""
    return parse(scrape(url, timeout), source=f"metrics endpoint {url}")
