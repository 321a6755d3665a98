"""DRAFTSYNC_ENV_FILE: one file read like the environment, for draftsync's settings and the libraries' variables."""

from __future__ import annotations

import os

import pytest
from draftsync.errors import DraftsyncError
from draftsync.settings import Settings, apply_environment, write_workdir_settings

LIBRARY_KEYS = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    "PREFECT_API_AUTH_STRING",
)


@pytest.fixture
def clean_environment(tmp_path, monkeypatch):
    """No variable the env file sets comes from the shell; os.environ is put back whole afterwards (apply_environment
    exports into it)."""
    saved = dict(os.environ)
    for key in (*LIBRARY_KEYS, "DRAFTSYNC_ENV_FILE", "DRAFTSYNC_MONITOR_DB_URL", "DRAFTSYNC_ALERT_TO"):
        monkeypatch.delenv(key, raising=False)
    for key in ("DRAFTSYNC_STALE_THRESHOLD", "DRAFTSYNC_MISMATCH_THRESHOLD", "DRAFTSYNC_SERVING_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path / "work"))
    (tmp_path / "work").mkdir()
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved)


def test_the_env_file_gives_settings_and_library_variables_and_the_environment_wins(clean_environment, monkeypatch):
    tmp_path = clean_environment
    env_file = tmp_path / "draftsync.env"
    env_file.write_text(
        "# mounted from a Secret\n"
        "MLFLOW_TRACKING_URI=http://mlflow.internal:5000\n"
        "MLFLOW_TRACKING_USERNAME=draftsync\n"
        "MLFLOW_TRACKING_PASSWORD='pw with spaces'\n"
        "PREFECT_API_AUTH_STRING=admin:pass\n"
        "DRAFTSYNC_MONITOR_DB_URL=postgresql+psycopg://draftsync@db/draftsync\n"
        "DRAFTSYNC_STALE_THRESHOLD=0.4\n"
        "DRAFTSYNC_ALERT_TO=from-file@example.org\n"
        "DRAFTSYNC_SERVING_TOKEN=serving-token\n"
    )
    monkeypatch.setenv("DRAFTSYNC_ENV_FILE", str(env_file))
    monkeypatch.setenv("DRAFTSYNC_ALERT_TO", "from-env@example.org")  # the environment wins
    write_workdir_settings(
        tmp_path / "work", {"DRAFTSYNC_STALE_THRESHOLD": "0.3", "DRAFTSYNC_MISMATCH_THRESHOLD": "0.7"}
    )

    settings = Settings.load()
    assert settings.monitor_db_url == "postgresql+psycopg://draftsync@db/draftsync"
    assert settings.stale_threshold == 0.4  # the env file wins over the work dir's settings.env ...
    assert settings.mismatch_threshold == 0.7  # ... which still gives what the env file lacks
    assert settings.alert_to == "from-env@example.org"
    assert settings.serving_token is not None and settings.serving_token.get_secret_value() == "serving-token"
    assert settings.mlflow_tracking_uri == "http://mlflow.internal:5000"  # before anything is exported too

    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "from-the-environment")
    apply_environment(settings)
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://mlflow.internal:5000"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "draftsync"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "from-the-environment"
    assert os.environ["PREFECT_API_AUTH_STRING"] == "admin:pass"


def test_the_work_dir_may_come_from_the_env_file(clean_environment, monkeypatch):
    tmp_path = clean_environment
    monkeypatch.delenv("DRAFTSYNC_WORKDIR")
    (tmp_path / "shared").mkdir()
    write_workdir_settings(tmp_path / "shared", {"DRAFTSYNC_STALE_THRESHOLD": "0.35"})
    (tmp_path / "draftsync.env").write_text(f"DRAFTSYNC_WORKDIR={tmp_path / 'shared'}\n")
    monkeypatch.setenv("DRAFTSYNC_ENV_FILE", str(tmp_path / "draftsync.env"))
    settings = Settings.load()
    assert settings.root == (tmp_path / "shared").resolve() and settings.stale_threshold == 0.35


@pytest.mark.parametrize("kind", ["missing", "a folder"])
def test_an_env_file_that_cannot_be_read_is_an_error_naming_it(clean_environment, monkeypatch, kind):
    tmp_path = clean_environment
    path = tmp_path / "draftsync.env"
    if kind == "a folder":
        path.mkdir()
    monkeypatch.setenv("DRAFTSYNC_ENV_FILE", str(path))
    with pytest.raises(DraftsyncError) as caught:
        Settings.load()
    assert f"DRAFTSYNC_ENV_FILE={path} cannot be read" in caught.value.what
    assert "mount the env file there" in caught.value.fix and "unset DRAFTSYNC_ENV_FILE" in caught.value.fix


def test_a_bad_value_in_the_env_file_is_named_like_one_in_the_environment(clean_environment, monkeypatch):
    tmp_path = clean_environment
    (tmp_path / "draftsync.env").write_text("DRAFTSYNC_STALE_THRESHOLD=high\n")
    monkeypatch.setenv("DRAFTSYNC_ENV_FILE", str(tmp_path / "draftsync.env"))
    with pytest.raises(DraftsyncError) as caught:
        Settings.load()
    assert "DRAFTSYNC_STALE_THRESHOLD='high'" in caught.value.what and "env file" in caught.value.fix
