"""What every `draftsync` command shares: the `--json` option, the one JSON writer behind it (and behind the
JSON a command prints), and the registry check that fails fast before Prefect starts.

The app and each command group import this module and never each other, so the CLI has no import cycle.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

ProfileOption = Annotated[
    str,
    typer.Option(
        "--profile",
        help="Sync profile: 'production' (GPU worker), 'demo' (2-core CPU), 'test' (smaller) or a YAML/JSON file.",
    ),
]
JsonOption = Annotated[Path | None, typer.Option("--json", help="Also write the result as JSON to this path.")]


def json_text(result: Any) -> str:
    """A command's result as the JSON it prints and writes: indented, anything not JSON (dates, paths) as text."""
    return json.dumps(result, indent=2, default=str)


def echo_json(result: Any) -> None:
    typer.echo(json_text(result))


def write_json(result: Any, json_path: Path | None) -> None:
    """Write `result` to `json_path` (its folder made as needed); nothing when no path was given."""
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json_text(result))


def check_registry() -> None:
    """Fail fast, before Prefect starts, when MLflow cannot be reached."""
    from draftsync.tasks import context

    context.registry().ping()
