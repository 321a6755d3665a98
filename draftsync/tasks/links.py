"""Links to where a person looks: the MLflow UI page of a model version, the Prefect UI page of a run.

MLflow's UI is the tracking server itself when the tracking URI is http(s); with an embedded SQLite
registry it is `mlflow ui` on that file (DRAFTSYNC_MLFLOW_UI_URL says where it runs). Prefect's UI is
PREFECT_UI_URL when set, else the API URL without its `/api`.
"""

from __future__ import annotations

import os

from draftsync.tasks import context

LOCAL_MLFLOW_UI = "http://127.0.0.1:5000"
LOCAL_PREFECT_UI = "http://127.0.0.1:4200"


def mlflow_ui() -> str:
    uri = context.settings().mlflow_tracking_uri
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    return (context.settings().mlflow_ui_url or LOCAL_MLFLOW_UI).rstrip("/")


# The MLflow UI opens in its GenAI (traces) view unless told otherwise: links ask for its model-training view.
MODEL_TRAINING_VIEW = "?workflowType=machine_learning"


def model_version_url(model_name: str, version: int | None = None) -> str:
    page = f"{mlflow_ui()}/#/models/{model_name}"
    return (page if version is None else f"{page}/versions/{int(version)}") + MODEL_TRAINING_VIEW


def prefect_ui() -> str:
    ui = os.environ.get("PREFECT_UI_URL")
    if ui:
        return ui.rstrip("/")
    api = os.environ.get("PREFECT_API_URL", "").rstrip("/")
    return api.removesuffix("/api") if api else LOCAL_PREFECT_UI


def flow_run_url(run_id: str | None = None) -> str:
    return f"{prefect_ui()}/runs/flow-run/{run_id}" if run_id else f"{prefect_ui()}/runs"
