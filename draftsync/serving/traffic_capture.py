"""Traffic capture at the router: a bounded sample of the prompts a deployment serves, with each request's acceptance,
for a retrain that learns from the traffic that went stale.

Off unless a deployment's `capture` section turns it on. A request is sampled at `rate` after its answer is sent
back; the sample is redacted (an optional hook, `package.module:function`, given the record and returning it, or None
to skip it) and queued for a writer thread that keeps at most `max_rows` rows for at most `retention_days` in a
SQLite file, the oldest going first. Nothing here may slow or fail a request: a full queue, a hook that raises or a
store that cannot be written drops the sample and counts why. Responses are kept only with `keep_responses`.
"""

from __future__ import annotations

import importlib
import json
import queue
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CAPTURED_PATHS = ("/v1/completions", "/v1/chat/completions")
DOMAIN_HEADER = "x-draftsync-domain"
CAPTURED_TASK = "captured"  # the task name captured prompts go by in a dataset and a validation
MAX_DOMAIN_CHARS = 64
QUEUE_ROWS = 1000  # samples waiting for the writer; beyond it a sample is dropped, never waited for
SCHEMA = """
CREATE TABLE IF NOT EXISTS captured_requests (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    deployment TEXT NOT NULL,
    domain TEXT,
    path TEXT NOT NULL,
    prompt TEXT NOT NULL,
    response TEXT,
    draft_tokens INTEGER,
    accepted_tokens INTEGER,
    max_tokens INTEGER,
    output_tokens INTEGER
)
"""
# Columns added since the first capture files: a file written before gets them on its next write.
ADDED_COLUMNS = {"max_tokens": "INTEGER", "output_tokens": "INTEGER"}


@dataclass(frozen=True)
class CapturedPrompt:
    """A captured request as a validation replays it: its prompt and the output length its client asked for (None
    where the capture predates the column or the client left it to the server)."""

    text: str
    max_tokens: int | None = None


Redactor = Callable[[dict[str, Any]], "dict[str, Any] | None"]


@dataclass(frozen=True)
class CaptureConfig:
    """Where and how much a router captures (a deployment's `capture` section, resolved to a file)."""

    path: Path
    deployment: str
    rate: float = 0.1
    max_rows: int = 10_000
    retention_days: float = 14.0
    redact: str | None = None  # "package.module:function"
    keep_responses: bool = False


def load_redactor(spec: str | None) -> Redactor | None:
    """The hook named `package.module:function`, imported once when the router starts (a bad name stops it there)."""
    if not spec:
        return None
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ValueError(f"capture redact hook {spec!r} is not 'package.module:function'")
    hook = getattr(importlib.import_module(module_name), function_name)
    if not callable(hook):
        raise ValueError(f"capture redact hook {spec!r} is not a function")
    return hook


def domain_label(headers: Mapping[str, str], body: Mapping[str, Any], counts: Counter) -> str | None:
    """The client's domain label: the X-Draftsync-Domain header, else the request's `metadata.domain` or `user`.
    Text only, cut to MAX_DOMAIN_CHARS printable characters; anything else is dropped and counted."""
    metadata = body.get("metadata")
    value: Any = headers.get(DOMAIN_HEADER)
    if value is None and isinstance(metadata, Mapping):
        value = metadata.get("domain")
    if value is None:
        value = body.get("user")
    if value is None:
        return None
    if not isinstance(value, str):
        counts["domain_dropped"] += 1
        return None
    text = "".join(ch for ch in value if ch.isprintable()).strip()
    if len(text) > MAX_DOMAIN_CHARS:
        counts["domain_truncated"] += 1
        text = text[:MAX_DOMAIN_CHARS]
    return text or None


def request_acceptance(answer: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """(draft tokens, accepted tokens) of one request, from vLLM's per-request spec-decode metrics when it sent them."""
    metrics = answer.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, Mapping) else None
    if not isinstance(spec, Mapping):
        return None, None
    drafted, accepted = spec.get("num_draft_tokens"), spec.get("num_accepted_draft_tokens")
    if isinstance(drafted, int) and isinstance(accepted, int) and 0 <= accepted <= drafted:
        return drafted, accepted
    return None, None


class TrafficCapture:
    """Samples requests into a bounded SQLite table from a writer thread; `offer` never blocks and never raises."""

    def __init__(self, config: CaptureConfig, clock: Callable[[], float] = time.time, seed: int | None = None):
        self.config = config
        self.redactor = load_redactor(config.redact)
        self.clock = clock
        self.counts: Counter = Counter()
        self._random = random.Random(seed)
        self._queue: queue.Queue = queue.Queue(maxsize=QUEUE_ROWS)
        self._writer = threading.Thread(target=self._write_forever, name="traffic-capture", daemon=True)
        self._writer.start()

    def offer(self, path: str, headers: Mapping[str, str], body: bytes, status: int, answer: bytes) -> None:
        """Consider one answered request for capture (called after the answer is ready)."""
        try:
            self._offer(path, headers, body, status, answer)
        except Exception:  # a sample never costs a request: whatever failed, it is dropped and counted
            self.counts["dropped_error"] += 1

    def _offer(self, path: str, headers: Mapping[str, str], body: bytes, status: int, answer: bytes) -> None:
        if path not in CAPTURED_PATHS or status != 200:
            return
        self.counts["seen"] += 1
        if self._random.random() >= self.config.rate:
            return
        request = json.loads(body)
        if not isinstance(request, dict):
            return
        prompt = request.get("messages") if path.endswith("chat/completions") else request.get("prompt")
        if prompt is None:
            return
        reply = json.loads(answer) if answer else {}
        drafted, accepted = request_acceptance(reply if isinstance(reply, dict) else {})
        usage = reply.get("usage") if isinstance(reply, dict) else None
        record: dict[str, Any] = {
            "at": self.clock(),
            "deployment": self.config.deployment,
            "domain": domain_label({k.lower(): v for k, v in headers.items()}, request, self.counts),
            "path": path,
            "prompt": prompt,
            "response": _response_text(reply) if self.config.keep_responses else None,
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "max_tokens": _positive_int(request.get("max_tokens", request.get("max_completion_tokens"))),
            "output_tokens": _positive_int(usage.get("completion_tokens")) if isinstance(usage, dict) else None,
        }
        kept: dict[str, Any] | None = record
        if self.redactor is not None:
            try:
                kept = self.redactor(dict(record))
            except Exception:
                self.counts["dropped_redaction"] += 1
                return
            if kept is None:
                self.counts["redacted_away"] += 1
                return
        try:
            self._queue.put_nowait(kept)
        except queue.Full:
            self.counts["dropped_queue"] += 1

    def flush(self, timeout: float = 10.0) -> None:
        """Wait until every queued sample is written or dropped (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def stats(self) -> dict[str, int]:
        return dict(self.counts)

    def _write_forever(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < 100:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            try:
                self._write(batch)
                self.counts["captured"] += len(batch)
            except (sqlite3.Error, OSError):  # the store is unavailable: these samples are lost, serving is not
                self.counts["dropped_store"] += len(batch)
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _write(self, batch: list[dict[str, Any]]) -> None:
        self.config.path.parent.mkdir(parents=True, exist_ok=True)
        connection = sqlite3.connect(self.config.path, timeout=1.0)
        try:
            with connection:
                connection.execute(SCHEMA)
                present = {row[1] for row in connection.execute("PRAGMA table_info(captured_requests)")}
                for column, kind in ADDED_COLUMNS.items():
                    if column not in present:
                        connection.execute(f"ALTER TABLE captured_requests ADD COLUMN {column} {kind}")
                connection.executemany(
                    "INSERT INTO captured_requests (at, deployment, domain, path, prompt, response, draft_tokens,"
                    " accepted_tokens, max_tokens, output_tokens) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (
                            float(r["at"]),
                            str(r["deployment"]),
                            r.get("domain"),
                            str(r["path"]),
                            json.dumps(r["prompt"]),
                            r.get("response"),
                            r.get("draft_tokens"),
                            r.get("accepted_tokens"),
                            r.get("max_tokens"),
                            r.get("output_tokens"),
                        )
                        for r in batch
                    ],
                )
                cutoff = self.clock() - self.config.retention_days * 86400
                connection.execute("DELETE FROM captured_requests WHERE at < ?", (cutoff,))
                connection.execute(
                    "DELETE FROM captured_requests WHERE id <= (SELECT id FROM captured_requests ORDER BY id DESC"
                    " LIMIT 1 OFFSET ?)",
                    (self.config.max_rows,),
                )
        finally:
            connection.close()


def captured_rows(path: Path, deployment: str | None = None, after_id: int = 0) -> list[dict[str, Any]]:
    """The captured requests in a capture file, oldest first, from row `after_id` on (what a retrain reads, and the
    scrape books into the monitor store)."""
    if not path.exists():
        return []
    connection = sqlite3.connect(path)
    connection.row_factory = sqlite3.Row
    try:
        query = "SELECT * FROM captured_requests WHERE id > ?" + (" AND deployment = ?" if deployment else "")
        arguments = (after_id, deployment) if deployment else (after_id,)
        rows = connection.execute(query + " ORDER BY id", arguments).fetchall()
    except sqlite3.OperationalError:  # no table yet: nothing was captured
        return []
    finally:
        connection.close()
    return [{**dict(row), "prompt": json.loads(row["prompt"])} for row in rows]


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _response_text(reply: Mapping[str, Any]) -> str | None:
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
        return None
    first = choices[0]
    message = first.get("message")
    text = message.get("content") if isinstance(message, Mapping) else first.get("text")
    return text if isinstance(text, str) else None
