"""What traffic capture costs the router: requests per second through a router process with capture off and on.

One HTTP upstream stands in for vLLM (it answers each completion at once, with per-request spec-decode metrics, so
the router's own work is all that is timed); two routers run in front of it, one without capture and one capturing
every request (rate 1, the worst case) into a SQLite file. `--rounds` rounds alternate the two, each sending
`--requests` completions from `--clients` concurrent clients; the figure is the median requests per second of each
and their ratio, read within the run.

Usage: python bench/router_capture.py [--requests N] [--clients C] [--rounds R] [--json PATH]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import emit_json, machine_facts  # noqa: E402

ANSWER = json.dumps(
    {
        "choices": [{"text": " ok"}],
        "metrics": {"speculative_decoding": {"num_draft_tokens": 30, "num_accepted_draft_tokens": 24}},
    }
)


def _start(work: Path, name: str, upstream: str, capture):
    from draftsync.serving.process import ServerProcess, free_port
    from draftsync.serving.router import LIVE_PATH, router_command, write_token_file

    write_token_file(work / f"{name}.token")
    port = free_port()
    argv = router_command("127.0.0.1", port, upstream, work / f"{name}.token", capture)
    router = ServerProcess(argv, "127.0.0.1", port, work / f"{name}.log", env={"DRAFTSYNC_ROUTER_TOKEN": ""})
    router.start()
    router.wait_healthy(timeout=60, health_path=LIVE_PATH)
    return router


def _rate(url: str, requests: int, clients: int) -> float:
    import httpx

    def send(worker: int) -> None:
        with httpx.Client(timeout=30) as client:
            for index in range(worker, requests, clients):
                body = {"model": "m", "prompt": f"def f{index}(x):\n    return", "max_tokens": 16}
                answer = client.post(f"{url}/v1/completions", json=body, headers={"X-Draftsync-Domain": "code"})
                answer.raise_for_status()

    started = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        list(pool.map(send, range(clients)))
    return requests / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    load = os.getloadavg()[0]

    from draftsync.serving.traffic_capture import CaptureConfig, captured_rows
    from tests.support.http_stub import HttpStub

    rates: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as work_dir, HttpStub(lambda _: (200, "application/json", ANSWER)) as upstream:
        work = Path(work_dir)
        capture = CaptureConfig(path=work / "traffic.db", deployment="bench", rate=1.0, max_rows=1_000_000)
        routers = {"off": _start(work, "off", upstream.url, None), "on": _start(work, "on", upstream.url, capture)}
        try:
            for round_index in range(args.rounds):
                for mode in ("off", "on") if round_index % 2 == 0 else ("on", "off"):
                    rates[mode].append(_rate(routers[mode].url, args.requests, args.clients))
                    print(f"round {round_index}: capture {mode} {rates[mode][-1]:.0f} requests/s", file=sys.stderr)
            time.sleep(2)  # the writer thread finishes the last batch
            captured = len(captured_rows(capture.path))
        finally:
            for router in routers.values():
                router.stop()
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    emit_json(
        {
            "requests_per_round": args.requests,
            "clients": args.clients,
            "rounds": args.rounds,
            "capture_off_requests_per_s": round(off, 1),
            "capture_on_requests_per_s": round(on, 1),
            "on_over_off": round(on / off, 3),
            "rows_captured": captured,
            "requests_sent_with_capture": args.requests * args.rounds,
            "machine": machine_facts(load, ("httpx",)),
        },
        args.json,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
