"""Links to where a person looks: the MLflow UI page of a model version, the Prefect UI page of a run. Every link in
an e-mail or a Prefect artifact is made here.

The addresses draftsync talks to may be names only the stack resolves (http://mlflow:5000, http://prefect:4200/api),
so the UI addresses people open win whenever set: DRAFTSYNC_MLFLOW_UI_URL, DRAFTSYNC_PREFECT_UI_URL. Unset, MLflow's UI
is the tracking server itself when the tracking URI is http(s), else `mlflow ui` on 127.0.0.1:5000 (an embedded
SQLite registry); Prefect's is PREFECT_UI_URL, else the API URL without its `/api`.
"""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from draftsync.tasks import context

LOCAL_MLFLOW_UI = "http://127.0.0.1:5000"
LOCAL_PREFECT_UI = "http://127.0.0.1:4200"


def mlflow_ui() -> str:
    settings = context.settings()
    if settings.mlflow_ui_url:
        return settings.mlflow_ui_url.rstrip("/")
    uri = settings.mlflow_tracking_uri
    if not uri.startswith(("http://", "https://")):
        return LOCAL_MLFLOW_UI
    parts = urlsplit(uri)
    host = parts.netloc.rpartition("@")[2]  # a link carries no credentials or query, whatever the tracking URI holds
    return urlunsplit((parts.scheme, host, parts.path, "", "")).rstrip("/")


# The MLflow UI opens in its GenAI (traces) view unless told otherwise: links ask for its model-training view.
MODEL_TRAINING_VIEW = "?workflowType=machine_learning"


def model_version_url(model_name: str, version: int | None = None) -> str:
    page = f"{mlflow_ui()}/#/models/{model_name}"
    return (page if version is None else f"{page}/versions/{int(version)}") + MODEL_TRAINING_VIEW


def prefect_ui() -> str:
    ui = context.settings().prefect_ui_url or os.environ.get("PREFECT_UI_URL")
    if ui:
        return ui.rstrip("/")
    api = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    return api.removesuffix("/api") if api else LOCAL_PREFECT_UI


def flow_run_url(run_id: str | None = None) -> str:
    return f"{prefect_ui()}/runs/flow-run/{run_id}" if run_id else f"{prefect_ui()}/runs"


def current_run_url() -> str:
    """The Prefect UI page of the flow run this code runs in (an artifact's or an alert's link to it); outside a run,
    the runs list."""
    from prefect.runtime import flow_run

    return flow_run_url(flow_run.id)
