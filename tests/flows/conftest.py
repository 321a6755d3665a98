"""Flow tests run against one session-wide Prefect test harness and a real MLflow (SQLite) per test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def prefect_harness():
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture()
def workdir(tmp_path, monkeypatch, prefect_harness) -> Path:
    """A fresh draftsync work dir; tasks see it through the environment, as a worker would."""
    from draftsync.tasks import context

    for key in ("MLFLOW_TRACKING_URI", "DRAFTSYNC_MONITOR_DB_URL"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path / "work"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'work' / 'mlflow.db'}")
    context.reset()
    yield tmp_path / "work"
    from draftsync.tasks.serving import stop_all

    stop_all()
    context.reset()
