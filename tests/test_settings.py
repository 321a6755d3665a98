"""The settings a work dir was set up with are read by every later command on it; the environment still wins."""

from __future__ import annotations

from draftsync.settings import Settings, write_workdir_settings


def test_a_work_dirs_settings_file_is_read_and_the_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path))
    monkeypatch.delenv("DRAFTSYNC_STALE_THRESHOLD", raising=False)
    assert Settings().stale_threshold == 0.50  # nothing written yet: the default
    (tmp_path / "settings.env").write_text("DRAFTSYNC_ALERT_TO=team@example.org\n")
    write_workdir_settings(tmp_path, {"DRAFTSYNC_STALE_THRESHOLD": "0.7"})
    write_workdir_settings(tmp_path, {"DRAFTSYNC_STALE_THRESHOLD": "0.72"})  # rewritten, not repeated
    text = (tmp_path / "settings.env").read_text()
    assert text.count("DRAFTSYNC_STALE_THRESHOLD") == 1 and "DRAFTSYNC_ALERT_TO=team@example.org" in text
    settings = Settings()
    assert settings.stale_threshold == 0.72 and settings.alert_to == "team@example.org"
    monkeypatch.setenv("DRAFTSYNC_STALE_THRESHOLD", "0.4")
    assert Settings().stale_threshold == 0.4


def test_another_work_dir_does_not_read_the_file(tmp_path, monkeypatch):
    (tmp_path / "a").mkdir()
    write_workdir_settings(tmp_path / "a", {"DRAFTSYNC_STALE_THRESHOLD": "0.7"})
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path / "b"))
    monkeypatch.delenv("DRAFTSYNC_STALE_THRESHOLD", raising=False)
    assert Settings().stale_threshold == 0.50
