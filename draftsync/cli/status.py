"""`draftsync status`: one table of targets, their drafters' lineage, the deployments serving them, the week's
acceptance, recommended against measured gamma and the last sync. A plain function with typer options; the
`draftsync` app registers it as `status`. MLflow and the monitor store are opened only inside the command.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from draftsync.cli.common import JsonOption, check_registry, write_json

if TYPE_CHECKING:
    from rich.table import Table

SHOWN_DRAFTERS = 5  # newest drafter versions listed per target in the terminal; the JSON has them all
STATE_STYLES = {"serving": "green", "fallback": "yellow", "stale": "red"}
SYNC_STYLES = {"succeeded": "green", "running": "cyan", "requested": "cyan", "failed": "red"}
VALIDATION_STYLES = {"passed": "green", "failed": "red", "pending": "yellow"}


def status_command(json_path: JsonOption = None) -> None:
    """Show every target: versions and aliases, drafter versions with lineage, deployments and their state
    (serving / fallback / stale), the last 7 days' acceptance, recommended vs measured gamma, the last sync."""
    from rich.console import Console

    from draftsync.cli.status_query import current_status

    check_registry()
    status = current_status()
    console = Console()
    if status["targets"]:
        console.print(status_table(status))
    else:
        console.print(
            "no targets: register a model version tagged draftsync.kind=target "
            "(draftsync demo does) or name one in DRAFTSYNC_TARGETS"
        )
    write_json(status, json_path)


def _gamma_recommended(recommended: dict[str, Any] | None) -> str:
    if recommended is None:
        return "-"
    span = "-"
    if recommended["range"] is not None:
        low, high = recommended["range"]
        span = str(low) if low == high else f"{low}-{high}"
    start = recommended["start"]
    return span if start is None else f"{span} (start {start})"


def _drafter_lines(drafters: list[dict[str, Any]]) -> tuple[str, str]:
    """Newest first: `v3 <- t2 eagle3 passed [production]` and, beside it, `rec 2-4 (start 3) / meas 4`."""
    shown = sorted(drafters, key=lambda d: d["version"], reverse=True)[:SHOWN_DRAFTERS]
    lineage, gammas = [], []
    for drafter in shown:
        trained_for = "?" if drafter["trained_for"] is None else drafter["trained_for"]
        style = VALIDATION_STYLES.get(drafter["validation"], "")
        validation = f"[{style}]{drafter['validation']}[/]" if style else escape(drafter["validation"])
        aliases = escape(f" [{', '.join(drafter['aliases'])}]") if drafter["aliases"] else ""
        method = escape(drafter["method"] or "?")
        lineage.append(f"v{drafter['version']} <- t{trained_for} {method} {validation}{aliases}")
        measured = "-" if drafter["gamma_measured"] is None else drafter["gamma_measured"]
        gammas.append(f"rec {_gamma_recommended(drafter['gamma_recommended'])} / meas {measured}")
    if len(drafters) > len(shown):
        lineage.append(f"... {len(drafters) - len(shown)} older")
    if not drafters:
        return "[dim]no drafter[/]", "-"
    return "\n".join(lineage), "\n".join(gammas)


def _target_cell(target: dict[str, Any]) -> str:
    versions = ", ".join(f"v{v}" for v in target["versions"]) or "no versions"
    aliases = "\n".join(f"{alias} -> v{version}" for alias, version in target["aliases"].items())
    return "\n".join(part for part in (f"[bold]{escape(target['name'])}[/]", versions, aliases) if part)


def _sync_cell(job: dict[str, Any] | None) -> str:
    if job is None:
        return "-"
    style = SYNC_STYLES.get(job["status"], "")
    status = f"[{style}]{job['status']}[/]" if style else job["status"]
    # a re-opened job keeps the drafter of its previous generation: name it only for a success
    drafter = f" -> d{job['drafter_version']}" if job["status"] == "succeeded" and job["drafter_version"] else ""
    moments = [datetime.fromisoformat(job[key]) for key in ("requested_at", "started_at", "finished_at") if job[key]]
    return f"t{job['target_version']} {job['method']} {status}{drafter}\n{max(moments):%Y-%m-%d %H:%M} UTC"


def _deployment_cells(deployment: dict[str, Any] | None) -> list[str]:
    if deployment is None:
        return ["[dim]not deployed[/]", "-", "-", "-"]
    style = STATE_STYLES.get(deployment["state"], "")
    state = f"[{style}]{deployment['state']}[/]" if style else deployment["state"]
    if deployment["drafter_version"] is None:
        served = f"t{deployment['target_version']}, speculation off"
    else:
        served = f"t{deployment['target_version']} + d{deployment['drafter_version']}, gamma {deployment['gamma']}"
    acceptance = "-" if deployment["acceptance_7d"] is None else f"{deployment['acceptance_7d']:.2f}"
    return [escape(deployment["name"]), state, served, acceptance]


def status_table(status: dict[str, Any]) -> Table:
    """One row per target and deployment serving it; the target's own cells are filled on its first row only."""
    from rich.table import Table

    table = Table(title="draftsync status", show_lines=True)
    for header in (
        "target",
        "drafters (version <- trained for)",
        "gamma recommended / measured",
        "deployment",
        "state",
        "serving",
        "acceptance 7d",
        "last sync",
    ):
        table.add_column(header)
    for target in status["targets"]:
        lineage, gammas = _drafter_lines(target["drafters"])
        first = [_target_cell(target), lineage, gammas]
        for index, deployment in enumerate(target["deployments"] or [None]):
            own = first if index == 0 else ["", "", ""]
            table.add_row(*own, *_deployment_cells(deployment), _sync_cell(target["last_sync"]) if index == 0 else "")
    return table
