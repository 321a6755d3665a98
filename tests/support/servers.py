"""Real servers for tests, as context managers: `mlflow server`, `prefect server` and vLLM subprocesses and an
ASGI app under uvicorn.

Both listen on loopback on a free port and are stopped on exit, whatever happened inside the block.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from draftsync.serving.process import ServerProcess, free_port

MLFLOW_STARTUP_SECONDS = 120

# MLflow refuses http:// and loopback webhook URLs unless told these are fine (test and compose setups only).
MLFLOW_WEBHOOK_TEST_ENV = {
    "MLFLOW_WEBHOOK_ALLOWED_SCHEMES": "http,https",
    "MLFLOW_WEBHOOK_ALLOW_PRIVATE_IPS": "true",
    "MLFLOW_WEBHOOK_CACHE_TTL": "1",  # a webhook updated in a test takes effect at once
}


@dataclass
class MlflowServer:
    """A running `mlflow server`: `url` is its tracking URI; `log_path` holds its output."""

    url: str
    process: ServerProcess
    log_path: Path
    backend_store_uri: str


@contextmanager
def mlflow_server(
    tmp_path: Path,
    backend_store_uri: str | None = None,
    env: Mapping[str, str] | None = None,
    startup_timeout: float = MLFLOW_STARTUP_SECONDS,
) -> Iterator[MlflowServer]:
    """`mlflow server` on loopback (SQLite under `tmp_path` unless `backend_store_uri` names e.g. Postgres),
    with artifacts served from `tmp_path`, webhooks allowed to loopback http URLs, and no telemetry."""
    root = Path(tmp_path) / f"mlflow-server-{os.getpid()}-{time.monotonic_ns()}"
    root.mkdir(parents=True)
    backend = backend_store_uri or f"sqlite:///{root / 'mlflow.db'}"
    port = free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    argv = [
        str(mlflow_bin) if mlflow_bin.exists() else "mlflow",
        "server",
        "--backend-store-uri",
        backend,
        "--artifacts-destination",
        str(root / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    child_env = {
        "DO_NOT_TRACK": "true",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        **MLFLOW_WEBHOOK_TEST_ENV,
        **(env or {}),
    }
    process = ServerProcess(argv, "127.0.0.1", port, root / "server.log", env=child_env)
    process.start()
    try:
        process.wait_healthy(startup_timeout, health_path="/health")
        yield MlflowServer(url=process.url, process=process, log_path=root / "server.log", backend_store_uri=backend)
    finally:
        process.stop()


@contextmanager
def prefect_server(tmp_path: Path, database_url: str | None = None) -> Iterator[tuple[str, ServerProcess]]:
    """`prefect server start` on loopback, all services on; yields (API URL, process). Its database is SQLite under
    `tmp_path` unless `database_url` names Postgres (driven through asyncpg, as the server requires)."""
    port = free_port()
    env = {
        "PREFECT_HOME": str(Path(tmp_path) / "prefect-server-home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "true",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_API_URL": "",
    }
    if database_url is not None:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url.replace("+psycopg", "+asyncpg")
    prefect_bin = Path(sys.executable).with_name("prefect")
    process = ServerProcess(
        [
            str(prefect_bin) if prefect_bin.exists() else "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        "127.0.0.1",
        port,
        Path(tmp_path) / "prefect-server.log",
        env=env,
    )
    process.start()
    try:
        process.wait_healthy(240, health_path="/api/health")
        yield f"{process.url}/api", process
    finally:
        process.stop()


@contextmanager
def serve_asgi_in_thread(app, host: str = "127.0.0.1", startup_timeout: float = 30.0) -> Iterator[str]:
    """Run an ASGI app with uvicorn in a background thread; yields its base URL (http://host:port)."""
    import uvicorn

    port = free_port(host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + startup_timeout
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError(f"uvicorn on {host}:{port} stopped before it started")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"uvicorn on {host}:{port} did not start within {startup_timeout:.0f} s")
        time.sleep(0.05)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def vllm_process(
    engine, target_dir: Path, drafter_dir: Path | None, method: str, gamma: int, log_dir: Path, name: str = "agree"
) -> ServerProcess:
    """A vLLM server for a pair, started (not yet healthy) exactly as `launch: vllm` starts one: same argv and
    environment. Several can start at once; stop each."""
    from draftsync.serving.deployment import ServingDeployment

    port = free_port()
    deployment = ServingDeployment(name=name, target_name=name, launch="vllm")
    launch = deployment.vllm_launch(target_dir, drafter_dir, method, gamma, port=port, engine=engine)
    log = log_dir / f"vllm-{name}-{method}-{gamma}-{port}.log"
    return ServerProcess(launch.argv, "127.0.0.1", port, log, env=engine.environment()).start()
