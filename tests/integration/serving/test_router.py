"""The router as a real subprocess in front of real reference servers: a drafter swap under traffic loses nothing."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from draftsync.errors import DraftsyncError
from draftsync.serving.process import ServerProcess, free_port
from draftsync.serving.reference_server import reference_server_command
from draftsync.serving.router import LIVE_PATH, RouterClient, router_command, write_token_file
from prometheus_client.parser import text_string_to_metric_families

from tests.support.tiny_models import build_tiny_drafter

MODEL = "tiny"
V1_GAMMA, V2_GAMMA = 2, 3  # the two drafter versions differ in gamma, so every answer says which one served it
PROMPTS = ["def add(a, b):", "The sum of 12 and 30", "Permission is hereby", "def add(a"]


def start_reference_server(log_dir, target, drafter, gamma) -> ServerProcess:
    port = free_port()
    argv = reference_server_command(target, drafter, gamma, "127.0.0.1", port, MODEL)
    server = ServerProcess(
        argv, "127.0.0.1", port, log_dir / f"server-{port}.log", env={"DRAFTSYNC_TORCH_THREADS": "1"}
    )
    server.start()
    try:
        server.wait_healthy(timeout=180)
    except BaseException:
        server.stop()
        raise
    return server


def start_router(log_dir, upstream, token_file=None, env=None) -> ServerProcess:
    port = free_port()
    router = ServerProcess(
        router_command("127.0.0.1", port, upstream, token_file),
        "127.0.0.1",
        port,
        log_dir / "router.log",
        env={"DRAFTSYNC_ROUTER_TOKEN": "", **(env or {})},
    )
    router.start()
    try:
        router.wait_healthy(timeout=60, health_path=LIVE_PATH)
    except BaseException:
        router.stop()
        raise
    return router


@pytest.fixture(scope="module")
def drafter_v1(tiny_target, tmp_path_factory):
    return build_tiny_drafter(tiny_target, tmp_path_factory.mktemp("drafter-v1"), gamma=V1_GAMMA, seed=1)


@pytest.fixture(scope="module")
def servers(tiny_target, drafter_v1, tiny_drafter, tmp_path_factory):
    """Server A serves drafter v1, server B drafter v2 (the session's gamma-3 drafter); started side by side."""
    log_dir = tmp_path_factory.mktemp("servers")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        starting = [
            pool.submit(start_reference_server, log_dir, tiny_target, drafter_v1, V1_GAMMA),
            pool.submit(start_reference_server, log_dir, tiny_target, tiny_drafter, V2_GAMMA),
        ]
        concurrent.futures.wait(starting)
    started = [future.result() for future in starting if future.exception() is None]
    if len(started) < len(starting):
        for server in started:
            server.stop()
        next(future.result() for future in starting if future.exception() is not None)  # raises the first failure
    yield started
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("secrets") / "router.token"
    write_token_file(path)
    return path


def token_of(path) -> str:
    return path.read_text().strip()


def served_gamma(body: dict) -> int:
    return len(body["draftsync"]["accepted_per_position"])


class Traffic:
    """Client threads sending completions (and now and then /v1/models) through the router without pause.

    Each request records the phase it started in, its status, and which drafter answered it.
    """

    def __init__(self, url: str, threads: int = 2):
        self.url = url
        self.phase = "before switch"
        self.records: list[dict] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._send, args=(i,), daemon=True) for i in range(threads)]

    def __enter__(self) -> Traffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=60)

    def _send(self, worker: int) -> None:
        with httpx.Client(timeout=60) as client:
            for count in itertools.count():
                if self._stop.is_set():
                    return
                phase = self.phase
                record = {"phase": phase, "worker": worker}
                try:
                    if count % 5 == 4:
                        response = client.get(f"{self.url}/v1/models")
                        record["kind"] = "models"
                        if response.status_code == 200:
                            record["gamma"] = response.json()["data"][0]["draftsync"]["gamma"]
                    else:
                        prompt = PROMPTS[count % len(PROMPTS)]
                        response = client.post(
                            f"{self.url}/v1/completions",
                            json={"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0},
                        )
                        record["kind"] = "completion"
                        if response.status_code == 200:
                            record["gamma"] = served_gamma(response.json())
                    record["status"] = response.status_code
                    if response.status_code != 200:
                        record["error"] = response.text
                except httpx.HTTPError as error:
                    record["status"], record["error"] = None, f"{type(error).__name__}: {error}"
                with self._lock:
                    self.records.append(record)

    def answered(self, phase: str) -> list[dict]:
        with self._lock:
            return [r for r in self.records if r["phase"] == phase]

    def wait_for(self, phase: str, count: int, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while len(self.answered(phase)) < count:
            assert time.monotonic() < deadline, f"traffic stalled in phase {phase!r}: {self.records[-3:]}"
            time.sleep(0.05)


def test_swapping_drafter_v1_for_v2_under_continuous_traffic_fails_no_request(servers, token_file, tmp_path):
    server_a, server_b = servers
    router = start_router(tmp_path, server_a.url, token_file)
    try:
        assert httpx.get(f"{router.url}/health").json() == {"status": "ok", "upstream": server_a.url}
        admin = RouterClient(router.url, token_of(token_file))
        with Traffic(router.url) as traffic:
            traffic.wait_for("before switch", 8)
            traffic.phase = "switching"
            report = admin.switch(server_b.url)
            traffic.phase = "after switch"
            assert report["url"] == server_b.url and report["replaced"] == server_a.url
            assert report["replaced_in_flight"] in (0, 1, 2)  # at most one per client thread
            drained = admin.wait_drained(server_a.url, timeout=60)
            assert drained["in_flight"].get(server_a.url, 0) == 0
            # Killed without grace: had the router left anything on it, that request would fail now.
            server_a.stop(grace_seconds=0)
            assert not server_a.running()
            traffic.phase = "after old server stopped"
            traffic.wait_for("after old server stopped", 12)
        state = admin.state()
    finally:
        router.stop()

    failures = [r for r in traffic.records if r["status"] != 200]
    assert failures == []
    assert {r["gamma"] for r in traffic.answered("before switch")} == {V1_GAMMA}
    assert {r["gamma"] for r in traffic.answered("after switch")} <= {V2_GAMMA}
    assert {r["gamma"] for r in traffic.answered("after old server stopped")} == {V2_GAMMA}
    assert state["url"] == server_b.url and state["previous"] == server_a.url
    assert state["in_flight"] == {server_b.url: 0}
    answered_by_a = sum(1 for r in traffic.records if r["gamma"] == V1_GAMMA)
    assert state["answered"] == {server_a.url: answered_by_a, server_b.url: len(traffic.records) - answered_by_a}


def test_metrics_and_errors_pass_through_unchanged(servers, token_file, tmp_path):
    server_b = servers[1]
    router = start_router(tmp_path, server_b.url, token_file)
    try:
        families = {f.name: f for f in text_string_to_metric_families(httpx.get(f"{router.url}/metrics").text)}
        positions = {s.labels["position"] for s in families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples}
        assert positions == {str(p) for p in range(V2_GAMMA)}

        bad = {"model": MODEL, "prompt": "hi", "max_tokens": 0}
        direct = httpx.post(f"{server_b.url}/v1/completions", json=bad, timeout=30)
        proxied = httpx.post(f"{router.url}/v1/completions", json=bad, timeout=30)
        assert (proxied.status_code, proxied.json()) == (direct.status_code, direct.json()) == (400, direct.json())
        assert proxied.headers["content-type"] == "application/json"

        unknown = httpx.post(f"{router.url}/v1/completions", json={"model": "other", "prompt": "hi"}, timeout=30)
        assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
        assert httpx.get(f"{router.url}/v1/no-such-route").status_code == 404  # the upstream's 404, passed on
    finally:
        router.stop()


def test_a_wrong_or_missing_token_changes_nothing_and_the_token_is_never_shown(servers, token_file, tmp_path):
    server_b = servers[1]
    token = token_of(token_file)
    argv = router_command("127.0.0.1", 1, server_b.url, token_file)
    assert token not in " ".join(argv)
    router = start_router(tmp_path, server_b.url, token_file)
    try:
        admin_url = f"{router.url}/draftsync/upstream"
        elsewhere = {"url": "http://127.0.0.1:9"}
        assert httpx.put(admin_url, json=elsewhere).status_code == 401
        assert httpx.get(admin_url).status_code == 401
        wrong = {"Authorization": f"Bearer {token[:-1]}x"}
        assert httpx.put(admin_url, json=elsewhere, headers=wrong).status_code == 403
        assert httpx.put(admin_url, json=elsewhere, headers={"Authorization": token}).status_code == 401
        with pytest.raises(DraftsyncError, match="refused the token"):
            RouterClient(router.url, "not-the-token").switch("http://127.0.0.1:9", check_health=False)

        admin = RouterClient(router.url, token)
        assert admin.state()["url"] == server_b.url
        assert httpx.get(f"{router.url}/health").status_code == 200
        with pytest.raises(DraftsyncError, match="never drains"):
            admin.wait_drained(server_b.url, timeout=1)
        answer = httpx.put(admin_url, json={"url": "ftp://x"}, headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 400 and "not an http(s) base URL" in answer.json()["error"]
        assert admin.state()["url"] == server_b.url
    finally:
        router.stop()
    assert token not in (tmp_path / "router.log").read_text()


def test_a_dead_upstream_is_a_502_in_openai_shape_and_a_switch_to_one_is_refused(servers, token_file, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}"
    router = start_router(tmp_path, dead, token_file)
    try:
        response = httpx.post(f"{router.url}/v1/completions", json={"model": MODEL, "prompt": "hi"}, timeout=30)
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == 502 and error["type"] == "BadGatewayError"
        assert error["message"].startswith(f"upstream {dead} could not be connected to (is a server running there?)")
        health = httpx.get(f"{router.url}/health")
        assert health.status_code == 503 and health.json()["upstream"] == dead

        admin = RouterClient(router.url, token_of(token_file))
        also_dead = f"http://127.0.0.1:{free_port()}"
        with pytest.raises(DraftsyncError, match=f"upstream {also_dead} /health is unreachable"):
            admin.switch(also_dead)
        assert admin.state()["url"] == dead

        admin.switch(servers[1].url)  # a healthy one is taken, and the router is healthy again
        assert httpx.get(f"{router.url}/health").status_code == 200
    finally:
        router.stop()


class HeldUpstream:
    """An upstream whose completions wait until released: a request stays in flight for as long as a test needs."""

    def __init__(self):
        self.release = threading.Event()
        self.arrived = threading.Semaphore(0)
        held = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, body: dict) -> None:
                payload = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self):  # noqa: N802 - the name http.server calls
                self._answer({"status": "ok"})

            def do_POST(self):  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                held.arrived.release()
                held.release.wait(timeout=60)
                self._answer({"held": True})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HeldUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def test_a_replaced_upstream_counts_as_in_flight_until_its_last_answer_is_sent(servers, tmp_path):
    """Started with the token in the environment and no upstream: the router waits for one to be switched in."""
    token = "token-from-the-environment"
    router = start_router(tmp_path, None, env={"DRAFTSYNC_ROUTER_TOKEN": token})
    try:
        assert httpx.get(f"{router.url}/health").status_code == 503
        assert httpx.get(f"{router.url}/v1/models").status_code == 503
        admin = RouterClient(router.url, token)
        assert admin.state() == {"url": None, "previous": None, "in_flight": {}, "answered": {}, "switched_at": None}
        with HeldUpstream() as held, concurrent.futures.ThreadPoolExecutor(2) as pool:
            admin.switch(held.url)
            pending = [
                pool.submit(httpx.post, f"{router.url}/v1/completions", json={"n": i}, timeout=60) for i in range(2)
            ]
            for _ in pending:
                assert held.arrived.acquire(timeout=30)
            report = admin.switch(servers[1].url)
            assert report["replaced"] == held.url and report["replaced_in_flight"] == 2
            assert report["in_flight"] == {held.url: 2, servers[1].url: 0}
            with pytest.raises(DraftsyncError, match=f"2 request\\(s\\) still in flight on {held.url}"):
                admin.wait_drained(held.url, timeout=0.3)
            fresh = httpx.post(
                f"{router.url}/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=60
            )
            assert fresh.status_code == 200 and served_gamma(fresh.json()) == V2_GAMMA
            held.release.set()
            assert [future.result().json() for future in pending] == [{"held": True}] * 2
            state = admin.wait_drained(held.url, timeout=30)
        assert state["in_flight"] == {servers[1].url: 0}
        assert state["answered"] == {held.url: 2, servers[1].url: 1}
    finally:
        router.stop()


def test_the_router_refuses_to_start_without_a_token(tmp_path):
    port = free_port()
    argv = router_command("127.0.0.1", port, None, None)
    with ServerProcess(argv, "127.0.0.1", port, tmp_path / "router.log", env={"DRAFTSYNC_ROUTER_TOKEN": ""}) as router:
        with pytest.raises(DraftsyncError, match="exited with code 2") as raised:
            router.wait_healthy(timeout=30, health_path=LIVE_PATH)
    assert "the router has no admin token" in str(raised.value)
