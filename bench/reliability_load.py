"""Load on the monitor and the webhook receiver: one scrape cycle over 200 endpoints, the receiver at 200 requests/s.

Scrape: 200 serving pairs, each a real HTTP endpoint on its own loopback port (one stand-in server listening on
200 ports) serving vLLM's Prometheus text (tests/integration/monitors/vllm_metrics.txt, every value scaled per
endpoint).
The `acceptance-scrape` flow runs on Prefect's ephemeral API: a first cycle books each server's counters, the
counters grow by a different amount per endpoint, a second cycle books the deltas. `cycles_s` are the two flow
runs' wall times, `cycle_s` the slower one; `without_prefect_cycle_s` is one more cycle of the scrape task's own
function in a pool of the flow's size, so the difference is what Prefect's task runs cost. Every stored sample is
checked against the counters. `errors` counts failed scrapes, task retries (a retry hides a failure) and samples
that are wrong or missing.

Webhook: `draftsync webhooks serve` as its own process (the load generator does not share its GIL), the sync
ledger on the chosen store. An open-loop generator (asyncio, one connection per request as MLflow delivers, the
HTTP written by hand) sends at fixed times, `rate` requests/s for `seconds` s. In every 8 requests: 2 valid
deliveries for a model that is not a target (200, ignored), 2 valid deliveries for a target whose sync a warm-up
delivery already requested (200, "sync already requested"), 2 with a forged signature (401), 1 with a stale or
malformed timestamp (400), 1 replay of an earlier valid delivery (of the pair, one answer is 200 and one 409).
Latency is measured from the scheduled send time (a late generator counts against the receiver: no coordinated
omission) and from the actual send. `send_lag_p99_ms` and the CPU shares of the generator and of the receiver
show whether the generator kept its schedule. (An httpx.AsyncClient generator with a 64-connection pool did not:
0.75 of a core and 390 ms of send lag at 200/s on 2 cores, and every latency figure was the generator's.)

Stores: `postgres` (default; a throwaway cluster with initdb/pg_ctl, as production runs the store) or `sqlite`
(the embedded default, a file under the run's folder).

Measured on 2 CPU cores shared with other jobs (load average 4): Postgres: webhook 199.9 requests/s answered,
p50 5 ms, p99 22 ms, no error, receiver 0.52 of a core, generator 0.12; scrape cycles 4.4 and 8.9 s through
Prefect, 1.8 s without. SQLite: webhook 194.6/s, p50 15 ms, p99 0.9 s (each ledger write is a synced commit);
scrape cycles 6.5 and 7.6 s, 2.6 s without Prefect.

Usage: python bench/reliability_load.py [--json PATH] [--store postgres|sqlite] [--endpoints 200] [--rate 200]
       [--seconds 10] [--workdir DIR] [--postgres-bin DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script; pytest has the repository root on the path already
    sys.path.insert(0, str(ROOT))

from bench.harness import emit_json, isolated_environment, machine_facts, stop_ephemeral_prefect  # noqa: E402
from tests.support.http_stub import PROMETHEUS_TEXT, HttpStub, StubRequest  # noqa: E402

VLLM_TEXT = (ROOT / "tests" / "integration" / "monitors" / "vllm_metrics.txt").read_text()
TARGET_NAME = "load-llm"
TARGET_VERSION = 4
OTHER_MODEL = "embeddings-not-a-target"
RECEIVER_STARTUP_S = 120
ANSWER_TIMEOUT_S = 60  # a request unanswered this long counts as a connection error
# The kind of each request in a block of 8 (see the module docstring).
BLOCK = ("valid-other", "valid-other", "valid-target", "valid-target", "forged", "forged", "bad-timestamp", "replay")
# A replay repeats an earlier valid delivery this many blocks back, so that usually the original has been answered.
REPLAY_BLOCKS_BACK = 4


# --- scrape ---------------------------------------------------------------------------------------------------------
def scaled_exposition(text: str, factor: int) -> str:
    """The same exposition with every sample value multiplied by `factor` (a busier server, or a later scrape)."""
    lines = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            head, value = line.rsplit(" ", 1)
            line = f"{head} {float(value) * factor}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def growth_of(index: int) -> int:
    """How many times the base counters endpoint `index` adds between two cycles (1 to 7, so deltas differ)."""
    return index % 7 + 1


class MetricsFleet:
    """`count` vLLM /metrics endpoints, each on its own loopback port; endpoint i starts at (i + 1) x the base text."""

    def __init__(self, count: int):
        self.factors = [index + 1 for index in range(count)]
        self.metrics_gets = [0] * count  # GET /metrics answered, per endpoint
        self.other_requests: Counter[str] = Counter()
        self._texts: dict[int, str] = {}
        self.stub = HttpStub(self._answer, ports=count)
        self.index_of_port = {port: index for index, port in enumerate(self.stub.ports)}
        self.urls = self.stub.urls

    def _answer(self, request: StubRequest) -> tuple[int, str, str]:
        index = self.index_of_port[request.port]
        if (request.method, request.path) != ("GET", "/metrics"):
            self.other_requests[f"{request.method} {request.path}"] += 1
            return 404, "text/plain", "404 page not found\n"
        self.metrics_gets[index] += 1
        factor = self.factors[index]
        text = self._texts.get(factor)
        if text is None:
            text = self._texts[factor] = scaled_exposition(VLLM_TEXT, factor)
        return 200, PROMETHEUS_TEXT, text

    @staticmethod
    def deployment(index: int) -> str:
        return f"load-{index:03d}"

    def register(self, store) -> None:
        """One serving pair per endpoint in the monitor store, as a rollout records it."""
        from draftsync.monitors.tables import ServedPair

        for index, url in enumerate(self.urls):
            store.pairs.record(
                self.deployment(index),
                ServedPair(
                    target_name=TARGET_NAME,
                    target_version=TARGET_VERSION,
                    drafter_version=1,
                    gamma=3,
                    drafter_name=f"{TARGET_NAME}-drafter",
                ),
                endpoint=url,
                state="serving",
            )

    def grow(self) -> None:
        """Traffic between two cycles: endpoint i's counters grow by `growth_of(i)` x the base text."""
        self.factors = [factor + growth_of(index) for index, factor in enumerate(self.factors)]

    def close(self) -> None:
        self.stub.close()

    def __enter__(self) -> MetricsFleet:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def sample_problems(store, fleet: MetricsFleet, first: datetime, second: datetime) -> list[str]:
    """What is wrong with the stored samples after two cycles at `first` and `second` (empty when all is right).

    Each deployment must hold exactly two samples: the first cycle books the counters the server started with
    ((i + 1) x the base, the scrape task counts a new server from zero), the second the growth (growth_of(i) x)."""
    from draftsync.monitors.metrics import parse

    base = parse(VLLM_TEXT)
    problems = []
    for index in range(len(fleet.urls)):
        name = fleet.deployment(index)
        samples = store.acceptance.samples(name, first - timedelta(minutes=1), second + timedelta(minutes=1))
        if [s.ts for s in samples] != [first, second]:
            problems.append(f"{name}: samples at {[s.ts.isoformat() for s in samples]}, expected one per cycle")
            continue
        for sample, times in zip(samples, (index + 1, growth_of(index)), strict=True):
            got = (
                sample.drafts,
                sample.draft_tokens,
                sample.accepted,
                list(sample.accepted_per_position),
                sample.generation_tokens,
                sample.reset,
            )
            expected = (
                times * base.drafts,
                times * base.draft_tokens,
                times * base.accepted,
                [times * n for n in base.accepted_per_position],
                times * base.generation_tokens,
                False,
            )
            if got != expected:
                problems.append(f"{name} at {sample.ts.isoformat()}: stored {got}, expected {expected}")
    return problems


class TaskRunTrouble(logging.Handler):
    """Counts Prefect task-run log lines that report a failure or a retry: a retried scrape still ends well."""

    def __init__(self):
        super().__init__(level=logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.levelno >= logging.ERROR or "Retry" in message or "failed" in message.lower():
            self.lines.append(message[:300])


@contextlib.contextmanager
def watching_task_runs() -> Iterator[TaskRunTrouble]:
    trouble = TaskRunTrouble()
    logger = logging.getLogger("prefect.task_runs")
    logger.addHandler(trouble)
    try:
        yield trouble
    finally:
        logger.removeHandler(trouble)


def scrape_cycle_without_prefect(now: datetime) -> tuple[float, int]:
    """The flow's walk done with the scrape task's plain function in a pool of the flow's size: (seconds, errors)."""
    from concurrent.futures import ThreadPoolExecutor

    from draftsync.flows.scrape import SCRAPE_CONCURRENCY
    from draftsync.tasks import context
    from draftsync.tasks.monitoring import scrape_deployment

    started = time.perf_counter()
    names = [pair.deployment for pair in context.store().pairs.all()]
    with ThreadPoolExecutor(SCRAPE_CONCURRENCY) as pool:
        futures = [pool.submit(scrape_deployment.fn, name, now) for name in names]
    errors = sum(1 for future in futures if future.exception() is not None)
    return time.perf_counter() - started, errors


def measure_scrape(endpoints: int) -> dict:
    """Two `acceptance-scrape` flow runs over `endpoints` pairs (see the module docstring)."""
    from draftsync.flows.scrape import SCRAPE_CONCURRENCY, scrape
    from draftsync.tasks import context

    store = context.store()
    first = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
    second = first + timedelta(minutes=1)
    with MetricsFleet(endpoints) as fleet:
        fleet.register(store)
        cycles, results, trouble_lines = [], [], []
        for at in (first, second):
            with watching_task_runs() as trouble:
                started = time.perf_counter()
                results.append(scrape(at))
                cycles.append(time.perf_counter() - started)
            trouble_lines += trouble.lines
            fleet.grow()
        problems = sample_problems(store, fleet, first, second)
        plain_s, plain_errors = scrape_cycle_without_prefect(second + timedelta(minutes=1))
        metrics_gets = sum(fleet.metrics_gets)
    scraped = [sorted(r["deployment"] for r in result["deployments"]) for result in results]
    expected = sorted(fleet.deployment(i) for i in range(endpoints))
    missing = sum(len(set(expected) - set(names)) for names in scraped)
    return {
        "endpoints": endpoints,
        "cycle_s": round(max(cycles), 2),
        "cycles_s": [round(c, 2) for c in cycles],
        "errors": len(trouble_lines) + len(problems) + missing + plain_errors,
        "retries_or_failures": trouble_lines[:5],
        "wrong_samples": problems[:5],
        "missing": missing,
        "metrics_requests": metrics_gets,
        "concurrency": SCRAPE_CONCURRENCY,
        "without_prefect_cycle_s": round(plain_s, 2),
    }


# --- webhook --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Delivery:
    """One planned request: its kind (see BLOCK), body and headers; a replay names the index of its original."""

    index: int
    kind: str
    body: bytes
    headers: dict[str, str]
    original: int | None = None


@dataclass(frozen=True)
class Outcome:
    """What one request got: status (None on a connection error), the answer's `reason` or `action`, and times
    (loop clock, seconds): when it was due, when it was sent, when the answer was read."""

    index: int
    status: int | None
    said: str | None
    error: str | None
    scheduled: float
    sent: float
    done: float


def version_created(model: str, version: int, tags: dict[str, str] | None = None) -> bytes:
    """MLflow's body for a new model version."""
    return json.dumps(
        {
            "entity": "model_version",
            "action": "created",
            "timestamp": datetime.now(UTC).isoformat(),
            "data": {
                "name": model,
                "version": str(version),
                "source": f"s3://models/{model}/{version}",
                "run_id": None,
                "tags": tags or {},
                "description": None,
            },
        }
    ).encode()


def plan_deliveries(secret: str, count: int, now: int) -> list[Delivery]:
    """`count` requests in blocks of BLOCK, signed at `now` (Unix seconds) as MLflow signs them."""
    from draftsync.registry.webhooks import sign_delivery

    target_body = version_created(TARGET_NAME, TARGET_VERSION, {"draftsync.kind": "target"})
    other_body = version_created(OTHER_MODEL, 1)
    planned: list[Delivery] = []
    for index in range(count):
        block, kind = divmod(index, len(BLOCK))
        kind = BLOCK[kind]
        delivery_id = str(uuid.uuid4())
        if kind == "valid-other":
            planned.append(Delivery(index, kind, other_body, sign_delivery(secret, delivery_id, now, other_body)))
        elif kind == "valid-target":
            planned.append(Delivery(index, kind, target_body, sign_delivery(secret, delivery_id, now, target_body)))
        elif kind == "forged":
            forged = sign_delivery("guessed-" + secret[:8], delivery_id, now, target_body)
            planned.append(Delivery(index, kind, target_body, forged))
        elif kind == "bad-timestamp":
            stamp: int | str = now - 3600 if block % 2 == 0 else f"{now}.5"  # stale, or not whole seconds
            planned.append(Delivery(index, kind, target_body, sign_delivery(secret, delivery_id, stamp, target_body)))
        else:  # a replay: the same body and headers as an earlier valid delivery, each original replayed once
            original_block = block - REPLAY_BLOCKS_BACK if block >= REPLAY_BLOCKS_BACK else block
            slot = BLOCK.index("valid-target") if block >= REPLAY_BLOCKS_BACK else BLOCK.index("valid-other")
            original = planned[original_block * len(BLOCK) + slot]
            planned.append(Delivery(index, kind, original.body, original.headers, original=original.index))
    return planned


async def _post(host: str, port: int, path: str, delivery: Delivery) -> tuple[int, bytes]:
    """One POST on a connection of its own (as MLflow delivers), HTTP/1.1 written by hand: a fraction of a
    millisecond of the generator's CPU, so that what falls behind under load is the receiver, not the generator."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = [
            f"POST {path} HTTP/1.1",
            f"Host: {host}:{port}",
            f"Content-Length: {len(delivery.body)}",
            "Connection: close",
            *(f"{name}: {value}" for name, value in delivery.headers.items()),
        ]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + delivery.body)
        answer = await reader.read(-1)  # the server closes the connection after its answer
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    _, _, body = rest.partition(b"\r\n\r\n")
    return int(status_line.split()[1]), body


async def _send(url: str, delivery: Delivery, scheduled: float) -> Outcome:
    parts = urlsplit(url)
    loop = asyncio.get_running_loop()
    sent = loop.time()
    try:
        status, body = await asyncio.wait_for(_post(parts.hostname, parts.port, parts.path, delivery), ANSWER_TIMEOUT_S)
    except (OSError, IndexError, ValueError) as error:  # refused, reset, timed out, or an answer that is not HTTP
        return Outcome(delivery.index, None, None, f"{type(error).__name__}: {error}", scheduled, sent, loop.time())
    done = loop.time()
    try:
        answer = json.loads(body)
        said = (answer.get("reason") or answer.get("action")) if isinstance(answer, dict) else str(answer)[:200]
    except ValueError:
        said = body[:200].decode(errors="replace")
    return Outcome(delivery.index, status, said, None, scheduled, sent, done)


async def _open_loop(url: str, deliveries: list[Delivery], rate: float) -> list[Outcome]:
    loop = asyncio.get_running_loop()
    start = loop.time() + 0.1
    pending = []
    for number, delivery in enumerate(deliveries):
        due = start + number / rate
        delay = due - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(_send(url, delivery, due)))
    return list(await asyncio.gather(*pending))


def open_loop(url: str, deliveries: list[Delivery], rate: float) -> list[Outcome]:
    """Send each delivery at its fixed time (`rate` per second) whatever the answers so far; all outcomes."""
    return asyncio.run(_open_loop(url, deliveries, rate))


def outcome_problems(deliveries: list[Delivery], outcomes: list[Outcome]) -> list[str]:
    """Every request whose answer is not the one its kind must get (empty when all are right)."""
    by_index = {o.index: o for o in outcomes}
    kind_of = {d.index: d.kind for d in deliveries}
    replayed = {d.original for d in deliveries if d.original is not None}
    expected = {
        "valid-other": (200, "ignored: not a target"),
        "valid-target": (200, "sync already requested"),
        "forged": (401, "bad_signature"),
    }
    problems = []
    for delivery in deliveries:
        got = by_index[delivery.index]
        if got.error is not None or got.status is None:
            problems.append(f"#{delivery.index} {delivery.kind}: {got.error}")
        elif delivery.kind == "bad-timestamp":
            if (got.status, got.said) not in ((400, "stale_timestamp"), (400, "bad_timestamp")):
                problems.append(f"#{delivery.index} bad-timestamp: {got.status} {got.said!r}, expected 400")
        elif delivery.kind == "replay":  # whichever copy came first is the delivery, the other one the replay
            original = by_index[delivery.original]
            first, second = sorted([original, got], key=lambda o: o.status or 0)
            status, said = expected[kind_of[delivery.original]]
            if (first.status, second.status, second.said) != (200, 409, "replayed") or not (
                first.said or ""
            ).startswith(said):
                problems.append(
                    f"#{delivery.index} replay of #{delivery.original}: answers "
                    f"{[(o.status, o.said) for o in (original, got)]}, expected one {status} {said!r} "
                    "and one 409 'replayed'"
                )
        elif delivery.index not in replayed:  # an original's answer is judged with its replay's
            status, said = expected[delivery.kind]
            if got.status != status or not (got.said or "").startswith(said):
                problems.append(
                    f"#{delivery.index} {delivery.kind}: {got.status} {got.said!r}, expected {status} {said!r}"
                )
    return problems


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * (len(ordered) - 1))))]


def load_summary(outcomes: list[Outcome], rate: float) -> dict:
    """Rates, latencies (ms) from the scheduled and the actual send, the generator's lag and the status counts."""
    answered = [o for o in outcomes if o.status is not None]
    first_due = min(o.scheduled for o in outcomes)
    from_schedule = [1000 * (o.done - o.scheduled) for o in answered]
    from_send = [1000 * (o.done - o.sent) for o in answered]
    lag = [1000 * (o.sent - o.scheduled) for o in outcomes]
    return {
        "rate_target": rate,
        "requests": len(outcomes),
        "sent_rps": round((len(outcomes) - 1) / (max(o.sent for o in outcomes) - min(o.sent for o in outcomes)), 1),
        "achieved_rps": round(len(answered) / (max(o.done for o in answered) - first_due), 1),
        "p50_ms": round(_percentile(from_schedule, 0.50), 1),
        "p99_ms": round(_percentile(from_schedule, 0.99), 1),
        "max_ms": round(max(from_schedule), 1),
        "p50_from_send_ms": round(_percentile(from_send, 0.50), 1),
        "p99_from_send_ms": round(_percentile(from_send, 0.99), 1),
        "send_lag_p99_ms": round(_percentile(lag, 0.99), 2),
        "send_lag_max_ms": round(max(lag), 2),
        "errors": sum(1 for o in outcomes if o.status is None or o.status >= 500),
        "by_status": {
            str(status): n
            for status, n in sorted(Counter(o.status for o in outcomes).items(), key=lambda item: item[0] or 0)
        },
    }


def process_cpu_s(pid: int | None = None) -> float:
    """User + system CPU seconds of a process (this one by default), from /proc."""
    if pid is None:
        usage = os.times()
        return usage.user + usage.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def register_delivered_versions(tracking_uri: str) -> None:
    """The versions the deliveries name, in the receiver's MLflow: it reads each version from the registry, so a
    delivery for a version MLflow does not hold would only be ignored."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri, registry_uri=tracking_uri)
    for model, versions, tags in ((TARGET_NAME, TARGET_VERSION, {"draftsync.kind": "target"}), (OTHER_MODEL, 2, {})):
        client.create_registered_model(model)
        for version in range(1, versions + 1):
            client.create_model_version(model, source=f"s3://models/{model}/{version}", tags=tags)


@contextlib.contextmanager
def receiver_process(run_dir: Path, secret: str, monitor_url: str, prefect_api_url: str) -> Iterator:
    """`draftsync webhooks serve` on a free loopback port, its log in `run_dir`; stopped on exit."""
    from draftsync.serving.process import ServerProcess, free_port

    port = free_port()
    draftsync_bin = Path(sys.executable).with_name("draftsync")
    tracking_uri = f"sqlite:///{run_dir / 'receiver-mlflow.db'}"
    register_delivered_versions(tracking_uri)
    env = {
        "DRAFTSYNC_WORKDIR": str(run_dir / "receiver-work"),
        "DRAFTSYNC_MONITOR_DB_URL": monitor_url,
        "DRAFTSYNC_WEBHOOK_SECRET": secret,
        "MLFLOW_TRACKING_URI": tracking_uri,
        "PREFECT_API_URL": prefect_api_url,
        "PREFECT_HOME": str(run_dir / "receiver-prefect"),
        "DO_NOT_TRACK": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    process = ServerProcess(
        [str(draftsync_bin), "webhooks", "serve", "--host", "127.0.0.1", "--port", str(port)],
        "127.0.0.1",
        port,
        run_dir / "receiver.log",
        env=env,
    )
    with process:
        process.wait_healthy(RECEIVER_STARTUP_S, health_path="/healthz")
        yield process


def warm_up(url: str, secret: str) -> dict:
    """One valid delivery for the target before the load: it requests the sync (and loads the receiver's code)."""
    import httpx
    from draftsync.registry.webhooks import sign_delivery

    body = version_created(TARGET_NAME, TARGET_VERSION, {"draftsync.kind": "target"})
    answer = httpx.post(
        url, content=body, headers=sign_delivery(secret, str(uuid.uuid4()), int(time.time()), body), timeout=120
    )
    answer.raise_for_status()
    return answer.json()


def measure_webhook(run_dir: Path, monitor_url: str, prefect_api_url: str, rate: float, seconds: float) -> dict:
    """The receiver under the open-loop load (see the module docstring), with the ledger checked afterwards."""
    from draftsync.monitors.store import Store
    from draftsync.receiver.app import WEBHOOK_PATH

    secret = secrets.token_hex(32)
    with receiver_process(run_dir, secret, monitor_url, prefect_api_url) as receiver:
        url = receiver.url + WEBHOOK_PATH
        warmed = warm_up(url, secret)
        deliveries = plan_deliveries(secret, round(rate * seconds), int(time.time()))
        receiver_cpu, own_cpu, started = process_cpu_s(receiver.pid), process_cpu_s(), time.perf_counter()
        outcomes = open_loop(url, deliveries, rate)
        wall = time.perf_counter() - started
        receiver_cpu, own_cpu = process_cpu_s(receiver.pid) - receiver_cpu, process_cpu_s() - own_cpu
    problems = outcome_problems(deliveries, outcomes)
    store = Store(monitor_url)
    try:
        jobs = [(job.target_name, job.target_version) for job in store.ledger.jobs()]
    finally:
        store.close()
    return {
        **load_summary(outcomes, rate),
        "wrong_answers": len(problems),
        "examples": problems[:5],
        "warm_up": warmed.get("action"),
        "ledger_jobs": jobs,
        "receiver_cpu_share": round(receiver_cpu / wall, 2),
        "generator_cpu_share": round(own_cpu / wall, 2),
    }


# --- the run --------------------------------------------------------------------------------------------------------
def ephemeral_prefect_api() -> str:
    """Start Prefect's ephemeral API (outside every timed figure) and return its URL, for the receiver's events."""
    from prefect.client.orchestration import get_client
    from prefect.server.api.server import SubprocessASGIServer

    with get_client(sync_client=True) as client:
        client.api_healthcheck()
    return next(iter(SubprocessASGIServer._instances.values())).api_url


@contextlib.contextmanager
def monitor_database(store: str, run_dir: Path, postgres_bin_dir: str | None) -> Iterator[str]:
    if store == "sqlite":
        yield f"sqlite:///{run_dir / 'monitor.db'}"
        return
    from bench.monitor_scale import postgres_bin, postgres_cluster

    cluster_dir = Path(tempfile.mkdtemp(prefix="draftsync-load-pg-"))  # a folder the cluster's own user can enter
    try:
        with postgres_cluster(postgres_bin(postgres_bin_dir), cluster_dir / "cluster") as url:
            yield url
    finally:
        shutil.rmtree(cluster_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    parser.add_argument(
        "--store",
        choices=("postgres", "sqlite"),
        default="postgres",
        help="the monitor store and sync ledger (default: %(default)s)",
    )
    parser.add_argument("--endpoints", type=int, default=200, help="serving pairs scraped (default: %(default)s)")
    parser.add_argument("--rate", type=float, default=200.0, help="webhook requests per second (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of the webhook load (default: %(default)s)")
    parser.add_argument("--workdir", type=Path, help="where the run's folder goes (default: a temporary directory)")
    parser.add_argument("--postgres-bin", help="folder of initdb and pg_ctl (default: found on the machine)")
    args = parser.parse_args()
    if args.endpoints < 1 or args.rate <= 0 or args.seconds <= 0:
        sys.exit("--endpoints, --rate and --seconds must be positive")
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="draftsync-reliability-load-"))).resolve()
    run_dir = workdir / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    run_dir.mkdir(parents=True)
    load_at_start = round(os.getloadavg()[0], 2)
    stdout = sys.stdout
    with contextlib.redirect_stdout(sys.stderr), monitor_database(args.store, run_dir, args.postgres_bin) as url:
        isolated_environment(
            run_dir, {"DRAFTSYNC_MONITOR_DB_URL": url, "MLFLOW_TRACKING_URI": f"sqlite:///{run_dir / 'mlflow.db'}"}
        )
        from draftsync.tasks import context

        context.reset()
        context.settings()
        try:
            api_url = ephemeral_prefect_api()
            scrape = measure_scrape(args.endpoints)
            webhook = measure_webhook(run_dir, url, api_url, args.rate, args.seconds)
        finally:
            context.store().close()
            stop_ephemeral_prefect()
    out = {
        "webhook": webhook,
        "scrape": scrape,
        "store": args.store,
        "machine": machine_facts(load_at_start, ("prefect",)),
        "run_dir": str(run_dir),
    }
    emit_json(out, args.json, stdout)


if __name__ == "__main__":
    main()
