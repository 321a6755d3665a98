"""Where tasks find the settings, the registry and the monitor store (built once per process)."""

from __future__ import annotations

import functools

from draftsync.settings import Settings, apply_environment


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
