"""Which shared settings a flow run on a work pool lacks (the runs themselves: tests/integration/flows/
test_work_pool_settings.py)."""

from __future__ import annotations

import pytest

DEPLOYMENTS = """\
deployments:
  - name: chat
    target_name: llama-chat
    launch: {launch}
  - name: chat-k8s
    target_name: llama-chat
    launch: external
    endpoint: http://chat.serving.svc:8000
"""


@pytest.fixture()
def settings_workdir(tmp_path, monkeypatch):
    from draftsync.tasks import context

    for key in ("MLFLOW_TRACKING_URI", "DRAFTSYNC_MONITOR_DB_URL", "DRAFTSYNC_ENV_FILE", "DRAFTSYNC_DEPLOYMENTS_FILE"):
        monkeypatch.delenv(key, raising=False)
    for key in ("DRAFTSYNC_SERVING_URL", "DRAFTSYNC_SERVING_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    context.reset()
    yield tmp_path / "work"
    context.reset()


def missing(*needs) -> list[str]:
    from draftsync.settings import Settings
    from draftsync.tasks import context

    context.reset()
    return context.missing_settings(Settings.load(), needs)


def test_the_embedded_registry_and_store_are_named_with_where_they_would_be(settings_workdir, monkeypatch):
    registry, store = missing("registry", "store")
    assert registry == f"MLFLOW_TRACKING_URI (unset: the registry would be sqlite:///{settings_workdir / 'mlflow.db'})"
    assert (
        store == f"DRAFTSYNC_MONITOR_DB_URL (unset: the monitor store would be sqlite:///{settings_workdir}/monitor.db)"
    )
    assert missing("store") == [store]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    monkeypatch.setenv("DRAFTSYNC_MONITOR_DB_URL", "postgresql+psycopg://draftsync@db/draftsync")
    assert missing("registry", "store") == []


@pytest.mark.parametrize("launch", ["vllm", "reference"])
def test_servers_a_flow_run_would_start_need_the_serving_service(settings_workdir, monkeypatch, launch):
    (settings_workdir / "deployments.yaml").write_text(DEPLOYMENTS.format(launch=launch))
    (url,) = missing("serving")
    assert url == "DRAFTSYNC_SERVING_URL (unset: the servers of chat would end with this flow run)"
    monkeypatch.setenv("DRAFTSYNC_SERVING_URL", "http://serving.internal:7000")
    assert missing("serving") == ["DRAFTSYNC_SERVING_TOKEN (the admin token of http://serving.internal:7000)"]
    monkeypatch.setenv("DRAFTSYNC_SERVING_TOKEN", "a-token")
    assert missing("serving") == []


def test_external_deployments_need_no_serving_service(settings_workdir):
    (settings_workdir / "deployments.yaml").write_text(DEPLOYMENTS.format(launch="external\n    endpoint: http://x:1"))
    assert missing("serving") == []
    (settings_workdir / "deployments.yaml").unlink()
    assert missing("serving") == []  # no deployments file: nothing to serve
