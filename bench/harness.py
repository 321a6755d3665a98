"""The frame of the orchestration benchmarks: a run isolated from the caller's settings, the machine it ran on,
the JSON on stdout (and in --json PATH), and Prefect's ephemeral API stopped with the rest."""

from __future__ import annotations

import importlib
import json
import os
import platform
import sys
from pathlib import Path
from typing import TextIO


def isolated_environment(run_dir: Path, settings: dict[str, str]) -> None:
    """Point draftsync, MLflow and Prefect at this run only: no setting from the caller's shell leaks in.

    The work dir and Prefect's home go under `run_dir`; `settings` adds what the benchmark itself needs."""
    for key in list(os.environ):
        if key.startswith(("DRAFTSYNC_", "MLFLOW_")) or key in (
            "PREFECT_API_URL",
            "PREFECT_API_KEY",
            "PREFECT_PROFILE",
        ):
            del os.environ[key]
    os.environ.update(
        {
            "DRAFTSYNC_WORKDIR": str(run_dir / "work"),
            "PREFECT_HOME": str(run_dir / "prefect"),
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "DO_NOT_TRACK": "true",
            **settings,
        }
    )


def machine_facts(load_at_start: float, packages: tuple[str, ...] = ()) -> dict:
    """Cores, platform, versions of `packages`, and the 1-minute load average at the start and now: these
    machines are shared, so a figure is read beside the load it was measured under."""
    versions = {name: importlib.import_module(name).__version__ for name in packages}
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **versions,
        "load_average_1min": {"start": load_at_start, "end": round(os.getloadavg()[0], 2)},
    }


def emit_json(out: dict, json_path: Path | None, stdout: TextIO = sys.stdout) -> None:
    """The results on `stdout` (progress went to stderr) and, with --json, in that file too; `machine` always names
    the CPU (model, cores, vector extensions), beside whatever else the benchmark recorded of its machine."""
    from draftsync.speculative.machine import machine_record

    out["machine"] = {**machine_record(), **out.get("machine", {})}
    text = json.dumps(out, indent=2)
    print(text, file=stdout)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(text + "\n")


def stop_ephemeral_prefect() -> None:
    """The ephemeral API is a subprocess Prefect starts on first use; stop it with the rest."""
    from draftsync.tasks.context import stop_ephemeral_prefect as stop

    stop()
