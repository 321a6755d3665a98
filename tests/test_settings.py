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


def test_impossible_thresholds_and_wrong_types_are_refused_in_one_line(tmp_path):
    """NaN, negative, above 1 or not a number: refused before any work, naming the variable, with no traceback."""
    import os
    import subprocess
    import sys

    for value, says in [
        ("nan", "finite number"),
        ("-3", "greater than or equal to 0"),
        ("42", "less than or equal to 1"),
    ]:
        env = {**os.environ, "DRAFTSYNC_WORKDIR": str(tmp_path), "DRAFTSYNC_STALE_THRESHOLD": value}
        env.pop("DRAFTSYNC_DEBUG", None)
        done = subprocess.run(
            [sys.executable, "-m", "draftsync.cli", "status"], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        assert f"error: setting DRAFTSYNC_STALE_THRESHOLD='{value}'" in done.stderr and says in done.stderr
        assert "fix: set DRAFTSYNC_STALE_THRESHOLD" in done.stderr
    env = {**os.environ, "DRAFTSYNC_WORKDIR": str(tmp_path), "DRAFTSYNC_MISMATCH_THRESHOLD": "high"}
    wrong_type = subprocess.run(
        [sys.executable, "-m", "draftsync.cli", "status"], env=env, capture_output=True, text=True
    )
    assert "DRAFTSYNC_MISMATCH_THRESHOLD='high'" in wrong_type.stderr and "Traceback" not in wrong_type.stderr


def test_a_password_is_masked_wherever_it_sits_in_a_url():
    from draftsync.redaction import masked_text, masked_url

    url = "postgresql+psycopg://admin:Hunter1@127.0.0.1:9/draftsync?password=Hunter2Secret&sslmode=require&Token=t0k"
    masked = masked_url(url)
    assert "Hunter1" not in masked and "Hunter2Secret" not in masked and "t0k" not in masked
    assert masked == "postgresql+psycopg://admin:***@127.0.0.1:9/draftsync?password=***&sslmode=require&Token=***"
    error = 'connection to "admin:Hunter1" failed; password=Hunter2Secret'
    assert masked_text(error, url) == 'connection to "admin:***" failed; password=***'
    assert masked_url("sqlite:////tmp/x/monitor.db") == "sqlite:////tmp/x/monitor.db"


def test_the_status_of_a_store_with_a_password_in_its_query_never_prints_it(tmp_path):
    import os
    import subprocess
    import sys

    env = {
        **os.environ,
        "DRAFTSYNC_WORKDIR": str(tmp_path),
        "DRAFTSYNC_MONITOR_DB_URL": "postgresql+psycopg://admin@127.0.0.1:9/draftsync?password=Hunter2Secret",
    }
    done = subprocess.run([sys.executable, "-m", "draftsync.cli", "status"], env=env, capture_output=True, text=True)
    assert done.returncode != 0 and "monitor store" in done.stderr and "password=***" in done.stderr
    assert "Hunter2Secret" not in done.stdout + done.stderr
