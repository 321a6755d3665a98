"""MLflow outages named once: a transport failure becomes an error that names the tracking server and the fix.

The registry's client goes through `NamedOutages`, so every call that never got an answer (server down,
connection cut, MLflow's own retries used up) fails the same way; a reachability check uses `quick_http`
so it answers in seconds instead of retrying for minutes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from draftsync.errors import DraftsyncError
from draftsync.redaction import masked_text, masked_url


class NamedOutages:
    """The MLflow client, with a transport failure (server down, connection cut, retries used up) turned into an
    error that names the tracking server and the fix. MLflow has already retried with backoff by then
    (MLFLOW_HTTP_REQUEST_MAX_RETRIES, MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR); errors the server answered pass as
    they are."""

    def __init__(self, client: Any, tracking_uri: str):
        self._wrapped, self._tracking_uri = client, tracking_uri

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._wrapped, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attribute(*args, **kwargs)
            except Exception as error:
                if not is_outage(error):
                    raise
                raise outage(self._tracking_uri, name, error) from error

        return call


def outage(tracking_uri: str, during: str, error: BaseException) -> DraftsyncError:
    return DraftsyncError(
        f"MLflow at {masked_url(tracking_uri)} could not be reached during {during} "
        f"({masked_text(first_line(error), tracking_uri)[:300]})",
        "start the tracking server again (or fix MLFLOW_TRACKING_URI) and rerun: a sync resumes from its "
        "dataset and checkpoints, and registration finds a version already created",
    )


def is_outage(error: BaseException) -> bool:
    """Whether the request never got an answer from the server: refused, reset, timed out after MLflow's retries."""
    import requests

    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (requests.ConnectionError, requests.Timeout, requests.exceptions.RetryError)):
            return True
        seen = seen.__cause__ or seen.__context__
    text = str(error)
    return "API request to" in text and any(
        sign in text for sign in ("Max retries exceeded", "Connection refused", "Connection aborted", "timed out")
    )


@contextmanager
def quick_http() -> Iterator[None]:
    """MLflow retries HTTP for minutes by default; a reachability check must answer in seconds."""
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
    saved = {key: os.environ.get(key) for key in quick}
    os.environ.update(quick)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__
