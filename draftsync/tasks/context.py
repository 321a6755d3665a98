"""Where tasks find the settings, the registry and the monitor store (built once per process)."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Literal

from draftsync.errors import DraftsyncError
from draftsync.settings import ENV_FILE_VARIABLE, Settings, apply_environment

# What a flow reaches that must be shared with every other flow run: the registry, the monitor store, and the serving
# service (the servers of a deployment launched by vllm or reference must outlive the run that starts them).
Need = Literal["registry", "store", "serving"]


@functools.lru_cache(maxsize=1)
def settings() -> Settings:
    current = Settings.load()
    apply_environment(current)
    return current


@functools.lru_cache(maxsize=1)
def registry():
    from draftsync.registry.model_registry import Registry

    current = settings()
    return Registry(current.mlflow_tracking_uri, current.mlflow_artifacts_dir)


@functools.lru_cache(maxsize=1)
def store():
    from draftsync.monitors.store import Store

    return Store(settings().monitor_url)


def sync_ledger():
    """The sync ledger, in the monitor store's database."""
    return store().ledger


def reset() -> None:
    """Forget cached objects (tests switch work dirs within one process)."""
    for cached in (settings, registry, store):
        cached.cache_clear()


def require_settings(flow_name: str, *needs: Need) -> None:
    """Fail a flow run a work pool started, before any work, naming each shared setting it lacks.

    A docker or kubernetes flow run gets only what its pool gives it (the env file at DRAFTSYNC_ENV_FILE, the `env`
    job variable): without them it would work on the embedded SQLite files of its own container, which no other run
    sees. Runs without a pool (`draftsync serve`, the demo, the command line) keep the embedded defaults."""
    pool = _work_pool_name()
    if pool is None:
        return
    missing = missing_settings(Settings.load(), needs)  # before the work dir is made: it may be the wrong place
    if missing:
        named = os.environ.get(ENV_FILE_VARIABLE)
        where = f"its env file {named}" if named else f"an env file named by {ENV_FILE_VARIABLE} (unset)"
        raise DraftsyncError(
            f"flow run of {flow_name} on work pool {pool!r} lacks {'; '.join(missing)}",
            f"give the pool's flow runs these settings: in {where}, or in the pool's `env` job variable",
        )


def missing_settings(current: Settings, needs: tuple[Need, ...]) -> list[str]:
    """Each shared setting `needs` calls for that `current` leaves at its embedded default, with what that means."""
    missing = []
    if "registry" in needs and current.mlflow_tracking_uri == current.embedded_mlflow_uri:
        missing.append(f"MLFLOW_TRACKING_URI (unset: the registry would be {current.embedded_mlflow_uri})")
    if "store" in needs and not current.monitor_db_url:
        missing.append(f"DRAFTSYNC_MONITOR_DB_URL (unset: the monitor store would be {current.monitor_url})")
    served = _launched_here(current) if "serving" in needs else []
    if served:
        if not current.serving_url:
            missing.append(
                f"DRAFTSYNC_SERVING_URL (unset: the servers of {', '.join(served)} would end with this flow run)"
            )
        elif current.serving_token is None:
            missing.append(f"DRAFTSYNC_SERVING_TOKEN (the admin token of {current.serving_url})")
    return missing


def _launched_here(current: Settings) -> list[str]:
    """The declared deployments draftsync launches itself (vllm, reference); a file that cannot be read counts as
    none here: the flow names its problem."""
    from draftsync.serving.deployment import load_deployments

    path = current.deployments_path
    if current.deployments_file is None and not os.path.lexists(path):
        return []
    try:
        return sorted(d.name for d in load_deployments(path) if d.launch != "external")
    except DraftsyncError:
        return []


def _work_pool_name() -> str | None:
    """The work pool of the flow run this code runs in; None outside a run, or in one without a pool (a subflow,
    a deployment `draftsync serve` runs itself)."""
    from prefect.context import FlowRunContext

    run_context = FlowRunContext.get()
    flow_run = getattr(run_context, "flow_run", None)
    return getattr(flow_run, "work_pool_name", None) or None


def logger():
    """The Prefect run logger inside a run (logs show in the UI), a plain logger when called directly."""
    import logging

    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger("draftsync")


def stop_ephemeral_prefect() -> None:
    """Stop the Prefect API subprocess that Prefect starts on first use when no server is configured: a long-running
    command stops it when it ends, or it outlives the command with PPID 1."""
    try:
        from prefect.events.worker import EventsWorker
        from prefect.server.api.server import SubprocessASGIServer
    except ImportError:
        return
    if SubprocessASGIServer._instances:
        EventsWorker.drain_all(timeout=30)  # events still queued reach the API before it stops
    for server in list(SubprocessASGIServer._instances.values()):
        server.stop()


@contextlib.contextmanager
def flows_without_heartbeats() -> Iterator[None]:
    """Flows called inside run without Prefect's flow-run heartbeat. The heartbeat tells Prefect that a worker is
    still alive; where every flow runs in the calling process (the demo, the tests) nobody watches for it, and its
    thread, which sleeps in whole seconds and is joined when the flow returns, holds each flow's return for up to a
    second (a scrape's 0.2 s flow took 1.1 s)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        yield
