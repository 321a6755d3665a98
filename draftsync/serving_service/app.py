"""The serving service: one long-running process owns the deployments' servers (vLLM, or the CPU reference server)
and their routers, so serving outlives the flow run that changed it, and a flow on any work pool steers it.

- `PUT /draftsync/deployments/{name}/pair` serves a pair at the deployment: the service downloads the target and
  drafter versions from MLflow into its own work dir, starts a candidate, checks and benchmarks it, and switches the
  deployment's router to it (serving/servers.py, `ServerBook.serve`). Body: {"target_version", "drafter_version"
  (null: speculation off), "gamma", "method", "schedule"}. One change per deployment at a time.
- `GET /draftsync/deployments` is what each deployment serves now: the pair, its router, server and vLLM launch.
- `GET /draftsync/deployments/{name}/traffic?after_id=N` is the traffic its router captured after row N (the
  scrape books its acceptance, a retrain learns from its prompts): the capture files live with the routers.
- Both need the service's token as `Authorization: Bearer <token>` (DRAFTSYNC_SERVING_TOKEN); a call without it, or
  with another token, is refused and changes nothing. `GET /healthz` answers without it.

Routers listen on each deployment's own port; flows reach them on the service's host (serving/service_client.py).
The servers are the service's children and stop with it; the pair each deployment was last switched to is kept in its
work dir (`served-pairs.json`), and a restarted service serves those pairs again before it takes any change.
Run: `draftsync serving run --host 0.0.0.0 --port 8100`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from draftsync.errors import DraftsyncError
from draftsync.files import atomic_write
from draftsync.monitors.tables import ServedPair
from draftsync.records import record_dict
from draftsync.registry.model_registry import drafter_model_name
from draftsync.serving.deployment import ServingDeployment
from draftsync.serving.router import bearer_refusal
from draftsync.serving.servers import PairSwitch
from draftsync.speculative.engine.decoding import DRAFT_SAMPLE_METHODS

HEALTH_PATH = "/healthz"
DEPLOYMENTS_PATH = "/draftsync/deployments"

Deployments = Callable[[], dict[str, ServingDeployment]]
Serve = Callable[[ServingDeployment, ServedPair], PairSwitch]
Served = Callable[[str], "dict | None"]
Captured = Callable[[ServingDeployment, int], list[dict]]
LOGGER = logging.getLogger(__name__)


class ServedPairs:
    """The pair each deployment was last switched to, in a JSON file of the service's work dir."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lock = threading.Lock()

    def all(self) -> dict[str, ServedPair]:
        if not self.path.exists():
            return {}
        return {name: ServedPair(**pair) for name, pair in json.loads(self.path.read_text()).items()}

    def remember(self, name: str, pair: ServedPair) -> None:
        with self.lock:
            pairs = {key: asdict(value) for key, value in self.all().items()}
            pairs[name] = asdict(pair)
            text = json.dumps(pairs, indent=2)
            atomic_write(self.path, lambda temp: temp.write_text(text))


def create_app(
    token: str, deployments: Deployments, serve: Serve, served: Served, pairs: ServedPairs, captured: Captured
) -> Starlette:
    """The admin API over `deployments` (read on every call, so an edited file counts), `serve` (a pair at a
    deployment, blocking until traffic moved), `served` (a deployment's record: router, server, launch), `pairs`
    (what each deployment was last switched to: served again when the app starts) and `captured` (a deployment's
    captured requests after a row id)."""
    expected = token.encode()
    locks: dict[str, threading.Lock] = {}

    def restore() -> None:
        """Serve each remembered pair again (its deployment's lock held, so a change asked meanwhile waits for it)."""
        try:
            specs = deployments()
        except DraftsyncError as error:
            LOGGER.error("nothing restored: %s (fix: %s)", error.what, error.fix)
            return
        for name, pair in pairs.all().items():
            spec = specs.get(name)
            if spec is None or spec.launch == "external":
                LOGGER.warning("deployment %s is no longer one this service serves: not restored", name)
                continue
            try:
                _serve_alone(locks.setdefault(name, threading.Lock()), serve, spec, pair)
                LOGGER.info("%s serves target v%s, drafter %s again", name, pair.target_version, pair.drafter_version)
            except Exception as error:  # one deployment that does not come back must not keep the others down
                LOGGER.error("%s could not be served again: %s", name, error)

    @asynccontextmanager
    async def lifespan(_: Starlette):
        threading.Thread(target=restore, name="restore-served-pairs", daemon=True).start()
        yield

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def list_served(request: Request) -> Response:
        refusal = bearer_refusal(request, expected, "serving service")
        if refusal is not None:
            return refusal
        specs = await run_in_threadpool(deployments)
        remembered = pairs.all()
        return JSONResponse({"deployments": {name: _public(remembered.get(name), served(name)) for name in specs}})

    async def deployment(request: Request) -> ServingDeployment | Response:
        """The deployment the path names, or the answer that refuses the call (no token, unknown name)."""
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
        return spec

    async def get_traffic(request: Request) -> Response:
        spec = await deployment(request)
        if isinstance(spec, Response):
            return spec
        after = request.query_params.get("after_id", "0")
        if not after.isdigit():
            return _error(400, f"after_id {after!r} is not a row id", "give after_id=N with N >= 0, or leave it out")
        rows = await run_in_threadpool(captured, spec, int(after))
        return JSONResponse({"capture": spec.capture is not None, "rows": rows})

    async def put_pair(request: Request) -> Response:
        spec = await deployment(request)
        if isinstance(spec, Response):
            return spec
        name = spec.name
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
                '"method": vLLM\'s method name or null, "schedule": null}',
            )
        lock = locks.setdefault(name, threading.Lock())
        try:
            switched = await run_in_threadpool(_serve_alone, lock, serve, spec, pair)
        except DraftsyncError as error:
            return _error(502, error.what, error.fix)
        pairs.remember(name, pair)
        record = served(name) or {}
        return JSONResponse({"router_port": record["router"]["port"], "switch": record_dict(switched)})

    return Starlette(
        lifespan=lifespan,
        routes=[
            Route(HEALTH_PATH, health, methods=["GET"]),
            Route(DEPLOYMENTS_PATH, list_served, methods=["GET"]),
            Route(DEPLOYMENTS_PATH + "/{name}/pair", put_pair, methods=["PUT"]),
            Route(DEPLOYMENTS_PATH + "/{name}/traffic", get_traffic, methods=["GET"]),
        ],
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
    draft_sampling = body.get("draft_sampling")
    if draft_sampling is not None and draft_sampling not in DRAFT_SAMPLE_METHODS:
        raise ValueError(f"draft_sampling {draft_sampling!r} is not one of {', '.join(DRAFT_SAMPLE_METHODS)} or null")
    return ServedPair(
        spec.target_name,
        target_version,
        drafter_version,
        gamma,
        drafter_name=drafter_model_name(spec.target_name),
        method=method,
        schedule=schedule,
        draft_sampling=draft_sampling,
    )


def _whole(body: dict, field: str, least: int, what: str) -> int:
    value = body.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{field} {value!r} is not {what}")
    return value


def _public(pair: ServedPair | None, record: dict | None) -> dict | None:
    """What a deployment serves: the pair's versions, gamma and method, then its router (without where the router's
    token lies), its server and the vLLM launch. None: the service serves nothing there."""
    if record is None:
        return None
    router = {key: value for key, value in (record.get("router") or {}).items() if key != "token_file"}
    return {**(asdict(pair) if pair is not None else {}), **record, "router": router}


def _error(status: int, what: str, fix: str) -> JSONResponse:
    return JSONResponse({"error": what, "fix": fix}, status)


def app_from_settings() -> Starlette:
    """The service over this process's settings: its work dir, its deployments file and MLflow."""
    from draftsync.tasks import context
    from draftsync.tasks.serving import captured_here, configured_deployments, serve_here, serving_record

    settings = context.settings()
    if settings.serving_token is None:
        raise DraftsyncError(
            "the serving service has no admin token",
            "set DRAFTSYNC_SERVING_TOKEN (a long random string; flows that steer the service get the same)",
        )
    return create_app(
        settings.serving_token.get_secret_value(),
        lambda: configured_deployments(),
        serve_here,
        serving_record,
        ServedPairs(settings.root / "served-pairs.json"),
        captured_here,
    )
