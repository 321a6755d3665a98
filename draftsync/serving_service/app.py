"""The serving service: one long-running process owns the deployments' servers (vLLM, or the CPU reference server)
and their routers, so serving outlives the flow run that changed it, and a flow on any work pool steers it.

- `PUT /draftsync/deployments/{name}/pair` serves a pair at the deployment: the service downloads the target and
  drafter versions from MLflow into its own work dir, starts a candidate, checks and benchmarks it, and switches the
  deployment's router to it (serving/servers.py, `ServerBook.serve`). Body: {"target_version", "drafter_version"
  (null: speculation off), "gamma", "method", "schedule"}. One change per deployment at a time.
- `GET /draftsync/deployments` is what each deployment serves now.
- Both need the service's token as `Authorization: Bearer <token>` (DRAFTSYNC_SERVING_TOKEN); a call without it, or
  with another token, is refused and changes nothing. `GET /healthz` answers without it.

Routers listen on each deployment's own port; flows reach them on the service's host (serving/service_client.py).
Run: `draftsync serving run --host 0.0.0.0 --port 8100`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from draftsync.errors import DraftsyncError
from draftsync.monitors.tables import ServedPair
from draftsync.records import record_dict
from draftsync.registry.model_registry import drafter_model_name
from draftsync.serving.deployment import ServingDeployment
from draftsync.serving.router import bearer_refusal
from draftsync.serving.servers import PairSwitch

HEALTH_PATH = "/healthz"
DEPLOYMENTS_PATH = "/draftsync/deployments"

Deployments = Callable[[], dict[str, ServingDeployment]]
Serve = Callable[[ServingDeployment, ServedPair], PairSwitch]
Served = Callable[[str], "dict | None"]


def create_app(token: str, deployments: Deployments, serve: Serve, served: Served) -> Starlette:
    """The admin API over `deployments` (read on every call, so an edited file counts), `serve` (a pair at a
    deployment, blocking until traffic moved) and `served` (a deployment's record: router, server, launch)."""
    expected = token.encode()
    locks: dict[str, threading.Lock] = {}

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def list_served(request: Request) -> Response:
        refusal = bearer_refusal(request, expected, "serving service")
        if refusal is not None:
            return refusal
        specs = await run_in_threadpool(deployments)
        return JSONResponse({"deployments": {name: _public(served(name)) for name in specs}})

    async def put_pair(request: Request) -> Response:
        refusal = bearer_refusal(request, expected, "serving service")
        if refusal is not None:
            return refusal
        name = request.path_params["name"]
        try:
            specs = await run_in_threadpool(deployments)
        except DraftsyncError as error:
            return _error(500, error.what, error.fix)
        spec = specs.get(name)
        if spec is None:
            return _error(
                404,
                f"no deployment is called {name!r}; known: {', '.join(sorted(specs)) or 'none'}",
                "declare it in the serving service's deployments file (DRAFTSYNC_DEPLOYMENTS_FILE)",
            )
        if spec.launch == "external":
            return _error(
                409,
                f"deployment {name} is launch: external: an orchestrator runs its servers",
                "serve it with launch vllm or reference to have the serving service run it",
            )
        try:
            pair = _pair(spec, await request.json())
        except ValueError as error:
            return _error(
                400,
                str(error),
                'send {"target_version": N, "drafter_version": N or null, "gamma": N, '
                '"method": "eagle3" or null, "schedule": null}',
            )
        lock = locks.setdefault(name, threading.Lock())
        try:
            switched = await run_in_threadpool(_serve_alone, lock, serve, spec, pair)
        except DraftsyncError as error:
            return _error(502, error.what, error.fix)
        record = served(name) or {}
        return JSONResponse({"router_port": record["router"]["port"], "switch": record_dict(switched)})

    return Starlette(
        routes=[
            Route(HEALTH_PATH, health, methods=["GET"]),
            Route(DEPLOYMENTS_PATH, list_served, methods=["GET"]),
            Route(DEPLOYMENTS_PATH + "/{name}/pair", put_pair, methods=["PUT"]),
        ]
    )


def _serve_alone(lock: threading.Lock, serve: Serve, spec: ServingDeployment, pair: ServedPair) -> PairSwitch:
    with lock:  # a rollout and a fallback for one deployment run one after the other
        return serve(spec, pair)


def _pair(spec: ServingDeployment, body: Any) -> ServedPair:
    """The pair a PUT asks for, checked field by field (ValueError names the field)."""
    if not isinstance(body, dict):
        raise ValueError("the body is not a JSON object")
    target_version = _whole(body, "target_version", 1, "a version number")
    drafter_version = None if body.get("drafter_version") is None else _whole(body, "drafter_version", 1, "a version")
    gamma = _whole(body, "gamma", 0, "a whole number >= 0")
    method, schedule = body.get("method"), body.get("schedule")
    if method is not None and not isinstance(method, str):
        raise ValueError(f"method {method!r} is not a string or null")
    if schedule is not None and not isinstance(schedule, list):
        raise ValueError(f"schedule {schedule!r} is not a list or null")
    return ServedPair(
        spec.target_name,
        target_version,
        drafter_version,
        gamma,
        drafter_name=drafter_model_name(spec.target_name),
        method=method,
        schedule=schedule,
    )


def _whole(body: dict, field: str, least: int, what: str) -> int:
    value = body.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{field} {value!r} is not {what}")
    return value


def _public(record: dict | None) -> dict | None:
    """A deployment's record without where its router's token lies."""
    if record is None:
        return None
    router = {key: value for key, value in (record.get("router") or {}).items() if key != "token_file"}
    return {**record, "router": router}


def _error(status: int, what: str, fix: str) -> JSONResponse:
    return JSONResponse({"error": what, "fix": fix}, status)


def app_from_settings() -> Starlette:
    """The service over this process's settings: its work dir, its deployments file and MLflow."""
    from draftsync.tasks import context
    from draftsync.tasks.serving import configured_deployments, serve_here, serving_record

    settings = context.settings()
    if settings.serving_token is None:
        raise DraftsyncError(
            "the serving service has no admin token",
            "set DRAFTSYNC_SERVING_TOKEN (a long random string; flows that steer the service get the same)",
        )
    return create_app(
        settings.serving_token.get_secret_value(), lambda: configured_deployments(), serve_here, serving_record
    )
