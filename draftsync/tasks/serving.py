"""Serving steps of a rollout: launch a pair, check it answers, stop the instance it replaces."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
from prefect import task
from prefect.cache_policies import NONE

from draftsync.serving.deployment import ServingDeployment
from draftsync.tasks import context
from draftsync.tasks.traffic import complete

_RUNNING: dict[str, object] = {}  # deployment -> ServerProcess started by this process


def _state_file(deployment: str) -> Path:
    return context.settings().root / "serving" / f"{deployment}.json"


@task(name="launch-server", cache_policy=NONE)
def launch_server(
    deployment: ServingDeployment, target_dir: str, drafter_dir: str | None, gamma: int, method: str
) -> dict:
    """Start the reference server for the pair and record the vLLM launch a GPU worker would use."""
    from draftsync.serving.process import ServerProcess, free_port
    from draftsync.serving.reference_server import reference_server_command
    from draftsync.serving.vllm_args import render_vllm_command

    logger = context.logger()
    port = deployment.port or free_port(deployment.host)
    vllm = render_vllm_command(
        target_dir, drafter_dir, method, gamma, deployment.host, port, deployment.name, deployment.tensor_parallel_size
    )
    if deployment.launch == "vllm":
        argv = vllm.argv
    else:
        argv = reference_server_command(target_dir, drafter_dir, gamma, deployment.host, port, deployment.name)
    log_dir = context.settings().root / "serving"
    log_dir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(argv, deployment.host, port, log_dir / f"{deployment.name}-{port}.log").start()
    try:
        server.wait_healthy(timeout=180)
    except Exception:
        server.stop()
        raise
    logger.info("%s serving on %s (pid %s)", deployment.name, server.url, server.pid)
    return {"endpoint": server.url, "pid": server.pid, "argv": argv, "vllm": vllm.as_record(), "server": server}


@task(name="smoke-request", retries=2, retry_delay_seconds=2, cache_policy=NONE)
def smoke_request(endpoint: str, model: str, prompt: str) -> dict:
    """One real completion: the new instance must answer before traffic moves to it."""
    with httpx.Client(base_url=endpoint, timeout=60) as client:
        return complete(client, model, prompt, max_tokens=8, temperature=0.0)


def adopt_server(deployment: str, launched: dict) -> None:
    """Make the launched server the deployment's current one and stop the one it replaces."""
    stop_server(deployment)
    _RUNNING[deployment] = launched["server"]
    path = _state_file(deployment)
    record = {key: launched[key] for key in ("pid", "endpoint", "argv", "vllm")}
    path.write_text(json.dumps(record, indent=2))


def serving_record(deployment: str) -> dict | None:
    """What the deployment runs now: pid, endpoint, argv, and the vLLM launch a GPU worker would use."""
    path = _state_file(deployment)
    return json.loads(path.read_text()) if path.exists() else None


def stop_server(deployment: str) -> None:
    """Stop the deployment's current server, whether this process or an earlier one started it."""
    server = _RUNNING.pop(deployment, None)
    if server is not None:
        server.stop()
    path = _state_file(deployment)
    if path.exists():
        pid = json.loads(path.read_text()).get("pid")
        if server is None and pid:
            try:
                os.killpg(int(pid), signal.SIGTERM)  # the server leads its own process group
            except ProcessLookupError:
                pass
        path.unlink()


def stop_all() -> None:
    for name in list(_RUNNING):
        stop_server(name)
