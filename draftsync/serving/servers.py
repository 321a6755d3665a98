"""The servers a work dir runs: launch a candidate, switch a deployment's router to it, adopt and stop them.

Clients talk to the deployment's router (`serving/router.py`) at the deployment's stable address; the
servers behind it (the CPU reference server, or `vllm serve` on a GPU worker) listen on free ports.
A switch points the router at the candidate, waits until no request is left on the old server, then
stops it, so a swap drops nothing. What runs is recorded in `<workdir>/serving/<deployment>.json`, so a
later process (the next CLI call, the next flow run) finds and steers it: it adopts the router while that
answers, and stops a server it did not start by signalling its process group. No Prefect here:
`tasks/serving.py` wraps these steps as tasks.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from draftsync.errors import DraftsyncError
from draftsync.serving.deployment import ServingDeployment
from draftsync.serving.process import ServerProcess, free_port

if TYPE_CHECKING:
    from draftsync.serving.traffic_capture import CaptureConfig
    from draftsync.serving.vllm_args import VllmLaunch

DRAIN_TIMEOUT_S = 600.0
# endpoint -> a server (or router) this process started, whatever work dir it was started for: what `stop_all`
# stops even when no state file names it (a candidate that never took traffic, a work dir already gone).
_STARTED: dict[str, ServerProcess] = {}


@dataclass(frozen=True)
class PairLaunch:
    """What a server is started with: the target and drafter checkpoints (None: speculation off), the gamma, the
    method vLLM drafts with, and the per-batch-size schedule (None: one gamma)."""

    target_dir: str
    drafter_dir: str | None
    gamma: int
    method: str | None
    schedule: list | None = None
    draft_sampling: str | None = None  # vLLM's draft_sample_method (None: the deployment's, else vLLM's default)


@dataclass(frozen=True)
class LaunchedServer:
    """A candidate that came up healthy and takes no traffic yet: where it listens, its process (group) id, its
    argument list, and the vLLM launch of its pair (recorded whatever the launch mode: it is what a GPU worker
    runs)."""

    endpoint: str
    pid: int | None
    argv: tuple[str, ...]
    vllm: VllmLaunch

    def backend_record(self) -> dict:
        """The server as a deployment's state file keeps it (`backend`)."""
        return {"endpoint": self.endpoint, "pid": self.pid, "argv": list(self.argv)}


@dataclass(frozen=True)
class Switched:
    """A deployment's router after a switch: its stable endpoint and the server it replaced (None: the first)."""

    endpoint: str
    replaced: str | None


@dataclass(frozen=True)
class PairChecks:
    """What a candidate must pass before it takes traffic: an answer to each smoke prompt, and the benchmark load
    that it and the server it would replace both get (ms per output token each)."""

    smoke_prompts: list[str]
    benchmark_prompts: list[str]
    benchmark_tokens: int
    temperature: float


@dataclass(frozen=True)
class PairSwitch:
    """A pair served: the router's stable endpoint, the server it replaced (None: the first) and its ms per output
    token under the benchmark (what the canary compares with), the vLLM launch of the pair, and each step in words."""

    endpoint: str
    replaced: str | None
    replaced_ms_per_token: float | None
    vllm: dict
    steps: list[str]


def check_models(endpoint: str, model: str) -> None:
    """`/v1/models` must list the deployment's served name: clients ask for it by that name."""
    listed = [m.get("id") for m in httpx.get(f"{endpoint}/v1/models", timeout=30).json().get("data", [])]
    if model not in listed:
        raise DraftsyncError(
            f"{endpoint}/v1/models lists {listed}, not {model!r}",
            "serve the model under the deployment's name (--served-model-name)",
        )


class ServerBook:
    """The servers, routers, logs and state files of one work dir's `serving` folder."""

    def __init__(self, folder: Path, logger: logging.Logger | logging.LoggerAdapter | None = None):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.logger = logger or logging.getLogger("draftsync")

    def _state_file(self, deployment: str) -> Path:
        return self.folder / f"{deployment}.json"

    def record(self, deployment: str) -> dict | None:
        """What the deployment runs now: its router, the server behind it (pid, endpoint, argv), the vLLM launch."""
        path = self._state_file(deployment)
        return json.loads(path.read_text()) if path.exists() else None

    def _write_record(self, deployment: str, record: dict) -> None:
        self._state_file(deployment).write_text(json.dumps(record, indent=2))

    def launch(self, deployment: ServingDeployment, pair: PairLaunch) -> LaunchedServer:
        """Start a server for the pair on a free port and wait until it is healthy. Its log stays in the serving
        folder; a vLLM that does not come up is named by its own error line and that log."""
        from draftsync.serving.reference_server import reference_server_command
        from draftsync.serving.vllm_engine import find_vllm_engine, wait_until_serving

        port = free_port(deployment.host)
        log = self.folder / f"{deployment.name}-{port}.log"
        engine = None
        if deployment.launch == "vllm":
            engine = find_vllm_engine()
            assert engine is not None, "find_vllm_engine(required=True) raises when there is none"
        vllm = deployment.vllm_launch(
            pair.target_dir,
            pair.drafter_dir,
            pair.method,
            pair.gamma,
            schedule=pair.schedule,
            port=port,
            engine=engine,
            draft_sampling=pair.draft_sampling,
        )
        if engine is not None:
            argv, env = vllm.argv, engine.environment()
        else:
            argv = reference_server_command(
                pair.target_dir,
                pair.drafter_dir,
                pair.gamma,
                deployment.host,
                port,
                deployment.name,
                draft_sampling=pair.draft_sampling or deployment.draft_sampling,
            )
            env = None
        server = ServerProcess(argv, deployment.host, port, log, env=env).start()
        try:
            if deployment.launch == "vllm":
                wait_until_serving(server, deployment.name)
            else:
                server.wait_healthy(timeout=180)
            check_models(server.url, deployment.name)
        except Exception:
            server.stop()
            raise
        _STARTED[server.url] = server
        self.logger.info("candidate for %s healthy on %s (pid %s)", deployment.name, server.url, server.pid)
        return LaunchedServer(endpoint=server.url, pid=server.pid, argv=tuple(argv), vllm=vllm)

    def _ensure_router(
        self, deployment: ServingDeployment, record: dict | None, first_upstream: str, capture: CaptureConfig | None
    ) -> dict:
        """The deployment's router, started on its stable address (pointing at `first_upstream`) if not running."""
        from draftsync.serving.router import LIVE_PATH, RouterClient, read_token, router_command, write_token_file

        router = (record or {}).get("router")
        if router:
            try:
                RouterClient(router["url"], read_token(router["token_file"]), timeout=5).state()
                return router
            except DraftsyncError:
                self.logger.warning("router %s is gone: starting a new one", router["url"])
        token_file = self.folder / f"{deployment.name}.router-token"
        write_token_file(token_file)
        port = deployment.port or (router or {}).get("port") or free_port(deployment.host)
        argv = router_command(deployment.host, port, first_upstream, token_file, capture)
        process = ServerProcess(argv, deployment.host, port, self.folder / f"{deployment.name}-router.log").start()
        try:
            process.wait_healthy(timeout=60, health_path=LIVE_PATH)
        except Exception:
            process.stop()
            raise
        _STARTED[process.url] = process
        return {"url": process.url, "port": port, "pid": process.pid, "token_file": str(token_file)}

    def switch(
        self, deployment: ServingDeployment, launched: LaunchedServer, capture: CaptureConfig | None
    ) -> Switched:
        """Point the deployment's router (started with `capture` when there is none) at the launched server, let
        the old server drain, stop it, and record what runs now."""
        from draftsync.serving.router import RouterClient, read_token

        record = self.record(deployment.name)
        router = self._ensure_router(deployment, record, launched.endpoint, capture)
        old = (record or {}).get("backend")
        client = RouterClient(router["url"], read_token(router["token_file"]))
        client.switch(launched.endpoint)
        if old and old["endpoint"] != launched.endpoint:
            client.wait_drained(old["endpoint"], timeout=DRAIN_TIMEOUT_S)  # returns at once when nothing is left
            _stop_process(old["endpoint"], old.get("pid"))
        self._write_record(
            deployment.name, {"router": router, "backend": launched.backend_record(), "vllm": launched.vllm.as_record()}
        )
        return Switched(endpoint=router["url"], replaced=old["endpoint"] if old else None)

    def serve(
        self, deployment: ServingDeployment, pair: PairLaunch, checks: PairChecks, capture: CaptureConfig | None
    ) -> PairSwitch:
        """Start a candidate for the pair, check it, benchmark it against the server it replaces, then switch the
        router to it. A candidate that fails a check is stopped and the router keeps what it served."""
        from draftsync.serving.completions import ms_per_token, smoke

        current = (self.record(deployment.name) or {}).get("backend")
        candidate = self.launch(deployment, pair)
        steps = [f"candidate healthy on {candidate.endpoint} (/health, /v1/models)"]
        try:
            smoke(candidate.endpoint, deployment.name, checks.smoke_prompts)
            steps.append(f"smoke: {len(checks.smoke_prompts)} requests answered")
            load = (deployment.name, checks.benchmark_prompts, checks.benchmark_tokens, checks.temperature)
            candidate_ms, current_ms = ms_per_token(candidate.endpoint, *load), None
            if current is not None:
                try:
                    current_ms = ms_per_token(current["endpoint"], *load)
                except (httpx.HTTPError, DraftsyncError) as error:  # the old instance may already be gone
                    self.logger.warning("the current instance %s did not answer the benchmark: %s", current, error)
            steps.append(f"benchmark: candidate {_ms(candidate_ms)} ms/token, current {_ms(current_ms)}")
        except Exception:
            self.stop_candidate(candidate)
            raise
        switched = self.switch(deployment, candidate, capture)
        steps.append(f"traffic switched at {switched.endpoint}; old server {switched.replaced} drained and stopped")
        self.logger.info("%s: router %s now forwards to %s", deployment.name, switched.endpoint, candidate.endpoint)
        return PairSwitch(
            endpoint=switched.endpoint,
            replaced=switched.replaced,
            replaced_ms_per_token=current_ms,
            vllm=candidate.vllm.as_record(),
            steps=steps,
        )

    def stop_candidate(self, launched: LaunchedServer) -> None:
        """A candidate that failed its checks never takes traffic: stop it."""
        _stop_process(launched.endpoint, launched.pid)

    def stop(self, deployment: str) -> bool:
        """Stop the deployment's server and its router, whether this process or an earlier one started them, and
        forget its state file; False when it runs nothing."""
        record = self.record(deployment)
        if record is None:
            return False
        for part in ("backend", "router"):
            entry = record.get(part) or {}
            _stop_process(entry.get("endpoint") or entry.get("url"), entry.get("pid"))
        self._state_file(deployment).unlink()
        return True

    def stop_all(self) -> list[str]:
        """Stop every deployment of this work dir, then every server this process started; returns the deployments
        that were running."""
        stopped = [path.stem for path in self.folder.glob("*.json") if self.stop(path.stem)]
        for server in list(_STARTED.values()):
            server.stop()
        _STARTED.clear()
        return stopped


def _ms(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


def _stop_process(endpoint: str | None, pid: int | None) -> None:
    """Stop a server this process started, or (started by an earlier process) signal its process group."""
    server = _STARTED.pop(endpoint, None) if endpoint else None
    if server is not None:
        server.stop()
    elif pid:
        try:
            os.killpg(int(pid), signal.SIGTERM)  # every server leads its own process group
        except ProcessLookupError:
            pass
