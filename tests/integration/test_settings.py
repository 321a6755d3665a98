"""The settings a work dir was set up with are read by every later command on it; the environment still wins."""

from __future__ import annotations

import pytest
from draftsync.errors import DraftsyncError
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


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("DRAFTSYNC_SMTP_PORT", "70000", "less than or equal to 65535"),
        ("DRAFTSYNC_SMTP_PORT", "-1", "greater than or equal to 1"),
        ("DRAFTSYNC_VLLM_CPU_KVCACHE_GB", "-1", "greater than 0"),
        ("DRAFTSYNC_VLLM_CPU_KVCACHE_GB", "nan", "finite number"),
        ("DRAFTSYNC_WEBHOOK_MAX_AGE_SECONDS", "-1", "greater than or equal to 1"),
        ("DRAFTSYNC_WEBHOOK_MAX_BODY_BYTES", "0", "greater than or equal to 1"),
        ("DRAFTSYNC_REPORT_TIMEZONE", "Mars/Olympus", "not an IANA time zone"),
        ("DRAFTSYNC_REPORT_TIMEZONE", "../../etc/passwd", "not an IANA time zone"),
        ("DRAFTSYNC_SYNC_PROFILE", "nope", "neither a profile (production, demo, test) nor a profile file"),
    ],
)
def test_a_setting_out_of_its_range_is_refused_naming_the_variable(monkeypatch, tmp_path, variable, value, says):
    """`status` took all of these; the receiver or the report failed later, or never said why."""
    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path))
    monkeypatch.setenv(variable, value)
    with pytest.raises(DraftsyncError) as refused:
        Settings.load()
    assert refused.value.what.startswith(f"setting {variable}='{value}'") and says in refused.value.what
    assert variable in refused.value.fix


def test_a_work_dir_that_cannot_be_made_is_named_with_its_cause(tmp_path, monkeypatch):
    """It was a FileExistsError traceback."""
    from draftsync.cli.app import app
    from typer.testing import CliRunner

    monkeypatch.setenv("DRAFTSYNC_WORKDIR", str(tmp_path))  # --workdir sets it: restored to what it was after

    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    result = CliRunner().invoke(app, ["--workdir", str(a_file / "work"), "status"])
    assert isinstance(result.exception, DraftsyncError)
    assert result.exception.what == f"work dir {a_file / 'work'} cannot be made ({a_file}: is a file)"
    assert "--workdir" in result.exception.fix
