"""A throwaway draftsync work dir, as a worker sees it through the environment (no Prefect server needed)."""

from __future__ import annotations

from pathlib import Path

import pytest


def use_workdir(monkeypatch: pytest.MonkeyPatch, root: Path) -> Path:
    """Point draftsync (settings, MLflow on SQLite, the monitor store) at a fresh work dir under `root`."""
    from draftsync.tasks import context

    for key in ("MLFLOW_TRACKING_URI", "DRAFTSYNC_MONITOR_DB_URL", "DRAFTSYNC_DEPLOYMENTS_FILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(root / "work"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{root / 'work' / 'mlflow.db'}")
    context.reset()
    return root / "work"
