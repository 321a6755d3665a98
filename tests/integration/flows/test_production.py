"""`draftsync serve` refuses a bad setup before it registers anything. The production-like run through real
Prefect and MLflow servers is tests/e2e/system/test_production.py's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def draftsync_bin() -> str:
    return str(Path(sys.executable).with_name("draftsync"))


@pytest.mark.parametrize(
    ("args", "api_url", "named"),
    [
        ([], None, "PREFECT_API_URL is unset"),
        (["--report-cron", "61 9 * * 1"], "http://127.0.0.1:9/api", "Invalid cron string"),
        (["--timezone", "Mars/Olympus"], "http://127.0.0.1:9/api", "Invalid timezone"),
        (["--profile", "turbo"], "http://127.0.0.1:9/api", "unknown sync profile 'turbo'"),
    ],
)
def test_serve_refuses_a_bad_setup_before_it_registers_anything(tmp_path, args, api_url, named):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "DRAFTSYNC_"))}
    env["DRAFTSYNC_WORKDIR"] = str(tmp_path / "work")
    if api_url:
        env["PREFECT_API_URL"] = api_url
    done = subprocess.run([draftsync_bin(), "serve", *args], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and named in done.stderr and "fix:" in done.stderr, done.stderr[-2000:]
