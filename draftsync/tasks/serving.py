"""Serving steps of a rollout: start a candidate, check it, switch the deployment's router to it, stop the old one.

Clients talk to the deployment's router (`serving/router.py`) at the deployment's stable address; the
servers behind it (the CPU reference server, or `vllm serve` on a GPU worker) listen on free ports.
A switch points the router at the candidate, waits until no request is left on the old server, then
stops it, so a swap drops nothing. What runs is recorded in `<workdir>/serving/<deployment>.json`, so a
later process (the next CLI call, the next flow run) finds and steers it.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
from prefect import task
from prefect.cache_policies import NONE

from draftsync.errors import DraftsyncError
from draftsync.serving.deployment import ServingDeployment, load_deployments
from draftsync.tasks import context
from draftsync.tasks.traffic import complete

if TYPE_CHECKING:
    from draftsync.serving.process import ServerProcess
    from draftsync.serving.traffic_capture import CaptureConfig

_RUNNING: dict[str, ServerProcess] = {}  # endpoint -> ServerProcess started by this process
DRAIN_TIMEOUT_S = 600.0


def configured_deployments(
    given: list[ServingDeployment] | None = None, problems: list[str] | None = None
) -> dict[str, ServingDeployment]:
    """The specs to act on: those given, else the deployments file's when it exists.

    With `problems`, a broken file is noted there instead of raised (the weekly e-mail is how the team hears of it)."""
    if given is not None:
        return {d.name: d for d in given}
    path = context.settings().deployments_path
    if not path.exists():
        return {}
    try:
        return {d.name: d for d in load_deployments(path)}
    except DraftsyncError as error:
        if problems is None:
            raise
        problems.append(f"{error.what} (fix: {error.fix}); no deployment was relaunched")
        return {}


def capture_config(deployment: ServingDeployment) -> CaptureConfig | None:
    """Where and how a deployment's router captures traffic (None: capture is off): a file per deployment under the
    work dir's traffic folder."""
    from draftsync.serving.traffic_capture import CaptureConfig

    settings = deployment.capture
    if settings is None:
        return None
    return CaptureConfig(
        path=context.settings().root / "traffic" / f"{deployment.name}.db",
        deployment=deployment.name,
        rate=settings.rate,
        max_rows=settings.max_rows,
        retention_days=settings.retention_days,
        redact=settings.redact,
        keep_responses=settings.keep_responses,
    )


def captured_prompts(target_name: str) -> tuple[list[str], str]:
    """The prompts the deployments serving `target_name` captured (oldest first), and where they came from in words:
    which deployments, how many, or why there are none (capture off, nothing captured yet)."""
    from draftsync.serving.traffic_capture import captured_rows

    serving = [spec for spec in configured_deployments().values() if spec.target_name == target_name]
    if not serving:
        return [], f"no deployment in the deployments file serves {target_name}"
    prompts: list[str] = []
    said = []
    for spec in serving:
        config = capture_config(spec)
        if config is None:
            said.append(f"{spec.name}: capture is off (give it a capture section)")
            continue
        rows = captured_rows(config.path, spec.name)
        texts = [text for row in rows if (text := _prompt_text(row["prompt"]))]
        prompts += texts
        said.append(f"{spec.name}: {len(texts)} captured prompts")
    return prompts, "; ".join(said)


def _prompt_text(prompt: object) -> str | None:
    """A completion's prompt, or a chat's last user message: what the target is asked to answer again."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        for message in reversed(prompt):
            if isinstance(message, dict) and message.get("role") == "user" and isinstance(message.get("content"), str):
                return message["content"]
    return None


def _serving_dir() -> Path:
    path = context.settings().root / "serving"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _state_file(deployment: str) -> Path:
    return _serving_dir() / f"{deployment}.json"


def serving_record(deployment: str) -> dict | None:
    """What the deployment runs now: its router, the server behind it (pid, endpoint, argv), the vLLM launch."""
    path = _state_file(deployment)
    return json.loads(path.read_text()) if path.exists() else None


def _write_record(deployment: str, record: dict) -> None:
    _state_file(deployment).write_text(json.dumps(record, indent=2))


def _stop_process(endpoint: str | None, pid: int | None) -> None:
    """Stop a server this process started, or (started by an earlier process) signal its process group."""
    server = _RUNNING.pop(endpoint, None) if endpoint else None
    if server is not None:
        server.stop()
    elif pid:
        try:
            os.killpg(int(pid), signal.SIGTERM)  # every server leads its own process group
        except ProcessLookupError:
            pass


@task(name="launch-server", cache_policy=NONE)
def launch_server(
    deployment: ServingDeployment,
    target_dir: str,
    drafter_dir: str | None,
    gamma: int,
    method: str | None,
    schedule: list | None = None,
) -> dict:
    """Start a server for the pair on a free port and wait until it is healthy; the vLLM launch is recorded
    whatever the launch mode (it is what a GPU worker runs). Its log stays under <workdir>/serving; a vLLM that
    does not come up is named by its own error line and that log."""
    from draftsync.serving.process import ServerProcess, free_port
    from draftsync.serving.reference_server import reference_server_command
    from draftsync.serving.vllm_engine import find_vllm_engine, wait_until_serving

    port = free_port(deployment.host)
    log = _serving_dir() / f"{deployment.name}-{port}.log"
    if deployment.launch == "vllm":
        engine = find_vllm_engine()
        assert engine is not None, "find_vllm_engine(required=True) raises when there is none"
        vllm = deployment.vllm_launch(
            target_dir, drafter_dir, method, gamma, schedule=schedule, port=port, engine=engine
        )
        argv, env = vllm.argv, engine.environment()
    else:
        vllm = deployment.vllm_launch(target_dir, drafter_dir, method, gamma, schedule=schedule, port=port)
        argv, env = (
            reference_server_command(target_dir, drafter_dir, gamma, deployment.host, port, deployment.name),
            None,
        )
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
    _RUNNING[server.url] = server
    context.logger().info("candidate for %s healthy on %s (pid %s)", deployment.name, server.url, server.pid)
    return {"endpoint": server.url, "pid": server.pid, "argv": argv, "vllm": vllm.as_record()}


def check_models(endpoint: str, model: str) -> None:
    """`/v1/models` must list the deployment's served name: clients ask for it by that name."""
    listed = [m.get("id") for m in httpx.get(f"{endpoint}/v1/models", timeout=30).json().get("data", [])]
    if model not in listed:
        raise DraftsyncError(
            f"{endpoint}/v1/models lists {listed}, not {model!r}",
            "serve the model under the deployment's name (--served-model-name)",
        )


@task(name="smoke-requests", retries=2, retry_delay_seconds=2, cache_policy=NONE)
def smoke_requests(endpoint: str, model: str, prompts: list[str], max_tokens: int = 8) -> dict:
    """Real completions: the candidate must answer each before any traffic moves to it."""
    with httpx.Client(base_url=endpoint, timeout=120) as client:
        tokens = [
            complete(client, model, p, max_tokens, temperature=0.0)["usage"]["completion_tokens"] for p in prompts
        ]
    return {"requests": len(prompts), "completion_tokens": sum(tokens)}


def ms_per_token(endpoint: str, model: str, prompts: list[str], max_tokens: int, temperature: float) -> float | None:
    """Wall time per output token over a few sequential requests: what a client sees, prefill included."""
    with httpx.Client(base_url=endpoint, timeout=300) as client:
        started, tokens = time.perf_counter(), 0
        for i, prompt in enumerate(prompts):
            tokens += complete(client, model, prompt, max_tokens, temperature, seed=i)["usage"]["completion_tokens"]
        return 1000.0 * (time.perf_counter() - started) / tokens if tokens else None


@task(name="benchmark-against-current", cache_policy=NONE)
def benchmark_against_current(
    candidate: str, current: str | None, model: str, prompts: list[str], max_tokens: int, temperature: float
) -> dict:
    """The same short load on the candidate and on the instance it would replace: ms per output token each."""
    result = {
        "candidate_ms_per_token": ms_per_token(candidate, model, prompts, max_tokens, temperature),
        "current_ms_per_token": None,
    }
    if current is not None:
        try:
            result["current_ms_per_token"] = ms_per_token(current, model, prompts, max_tokens, temperature)
        except (httpx.HTTPError, DraftsyncError) as error:  # the old instance may already be gone
            context.logger().warning("the current instance %s did not answer the benchmark: %s", current, error)
    return result


def _ensure_router(deployment: ServingDeployment, record: dict | None, first_upstream: str) -> dict:
    """The deployment's router, started on its stable address (pointing at `first_upstream`) if not running."""
    from draftsync.serving.process import ServerProcess, free_port
    from draftsync.serving.router import LIVE_PATH, RouterClient, read_token, router_command, write_token_file

    router = (record or {}).get("router")
    if router:
        try:
            RouterClient(router["url"], read_token(router["token_file"]), timeout=5).state()
            return router
        except DraftsyncError:
            context.logger().warning("router %s is gone: starting a new one", router["url"])
    token_file = _serving_dir() / f"{deployment.name}.router-token"
    write_token_file(token_file)
    port = deployment.port or (router or {}).get("port") or free_port(deployment.host)
    argv = router_command(deployment.host, port, first_upstream, token_file, capture_config(deployment))
    process = ServerProcess(argv, deployment.host, port, _serving_dir() / f"{deployment.name}-router.log").start()
    try:
        process.wait_healthy(timeout=60, health_path=LIVE_PATH)
    except Exception:
        process.stop()
        raise
    _RUNNING[process.url] = process
    return {"url": process.url, "port": port, "pid": process.pid, "token_file": str(token_file)}


@task(name="switch-traffic", cache_policy=NONE)
def switch_traffic(deployment: ServingDeployment, launched: dict) -> dict:
    """Point the deployment's router at the launched server, let the old server drain, then stop it.

    Returns the stable endpoint and the server it replaced (None on the first rollout)."""
    from draftsync.serving.router import RouterClient, read_token

    record = serving_record(deployment.name)
    router = _ensure_router(deployment, record, launched["endpoint"])
    old = (record or {}).get("backend")
    client = RouterClient(router["url"], read_token(router["token_file"]))
    client.switch(launched["endpoint"])
    if old and old["endpoint"] != launched["endpoint"]:
        client.wait_drained(old["endpoint"], timeout=DRAIN_TIMEOUT_S)  # returns at once when nothing is left
        _stop_process(old["endpoint"], old.get("pid"))
    backend = {k: launched[k] for k in ("endpoint", "pid", "argv")}
    _write_record(deployment.name, {"router": router, "backend": backend, "vllm": launched["vllm"]})
    context.logger().info(
        "%s: router %s now forwards to %s (replaced %s)",
        deployment.name,
        router["url"],
        launched["endpoint"],
        old["endpoint"] if old else "nothing",
    )
    return {"endpoint": router["url"], "replaced": old["endpoint"] if old else None}


def stop_candidate(launched: dict) -> None:
    """A candidate that failed its checks never takes traffic: stop it."""
    _stop_process(launched["endpoint"], launched.get("pid"))


def stop_server(deployment: str) -> None:
    """Stop the deployment's server and its router, whether this process or an earlier one started them.

    The monitor's store then says the pair is "stopped", so scrapes skip it instead of failing on a dead endpoint."""
    record = serving_record(deployment)
    if record is None:
        return
    for part in ("backend", "router"):
        entry = record.get(part) or {}
        _stop_process(entry.get("endpoint") or entry.get("url"), entry.get("pid"))
    _state_file(deployment).unlink()
    try:
        context.store().pairs.set_state(deployment, "stopped")
    except DraftsyncError as error:  # the servers are down either way; a store outage must not keep them up
        context.logger().warning("%s stopped, but the monitor store could not record it: %s", deployment, error)


def stop_all() -> None:
    """Stop every deployment this work dir runs (the end of the demo, the end of a test)."""
    for path in _serving_dir().glob("*.json"):
        stop_server(path.stem)
    for server in list(_RUNNING.values()):
        server.stop()
    _RUNNING.clear()
