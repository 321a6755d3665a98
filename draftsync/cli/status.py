"""`draftsync status`: one block per target with its drafters' lineage, the deployments serving them, the week's
acceptance, recommended against measured gamma and the last sync, readable at 80 columns. A plain function with
typer options; the `draftsync` app registers it as `status`. MLflow and the monitor store are opened only inside
the command.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from draftsync.cli.common import JsonOption, check_registry, write_json

if TYPE_CHECKING:
    from rich.console import Group

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
        for problem in status["problems"]:
            console.print(f"problem: {escape(problem)}", style="yellow", highlight=False)
    write_json(status, json_path)


def _gamma_recommended(recommended: dict[str, Any] | None) -> str:
    if recommended is None:
        return "-"
    if recommended.get("method") == "none":
        return "none"
    span = "-"
    if recommended["range"] is not None:
        low, high = recommended["range"]
        span = str(low) if low == high else f"{low}-{high}"
    start = recommended["start"]
    return span if start is None else f"{span} (start {start})"


def _drafter_lines(drafters: list[dict[str, Any]]) -> str:
    """Newest first: `v3 <- t2 eagle3 passed [production]; gamma rec 2-4 (start 3) / meas 4`."""
    if not drafters:
        return "[dim]no drafter[/]"
    shown = sorted(drafters, key=lambda d: d["version"], reverse=True)[:SHOWN_DRAFTERS]
    lines = []
    for drafter in shown:
        trained_for = "?" if drafter["trained_for"] is None else drafter["trained_for"]
        style = VALIDATION_STYLES.get(drafter["validation"], "")
        validation = f"[{style}]{drafter['validation']}[/]" if style else escape(drafter["validation"])
        aliases = escape(f" [{', '.join(drafter['aliases'])}]") if drafter["aliases"] else ""
        method = escape(drafter["method"] or "?")
        measured = "-" if drafter["gamma_measured"] is None else drafter["gamma_measured"]
        gamma = f"gamma rec {_gamma_recommended(drafter['gamma_recommended'])} / meas {measured}"
        lines.append(f"v{drafter['version']} <- t{trained_for} {method} {validation}{aliases}; {gamma}")
    if len(drafters) > len(shown):
        lines.append(f"... {len(drafters) - len(shown)} older")
    return "\n".join(lines)


def _target_heading(target: dict[str, Any]) -> str:
    versions = ", ".join(f"v{v}" for v in target["versions"]) or "no versions"
    aliases = "; ".join(f"{alias} -> v{version}" for alias, version in target["aliases"].items())
    return f"[bold]{escape(target['name'])}[/] ({versions}" + (f"; {aliases})" if aliases else ")")


def _sync_cell(job: dict[str, Any] | None) -> str:
    if job is None:
        return "-"
    style = SYNC_STYLES.get(job["status"], "")
    status = f"[{style}]{job['status']}[/]" if style else job["status"]
    # a re-opened job keeps the drafter of its previous generation: name it only for a success
    drafter = f" -> d{job['drafter_version']}" if job["status"] == "succeeded" and job["drafter_version"] else ""
    moments = [datetime.fromisoformat(job[key]) for key in ("requested_at", "started_at", "finished_at") if job[key]]
    why = f": {escape(job['detail'].splitlines()[0][:160])}" if job["status"] == "failed" and job["detail"] else ""
    return f"t{job['target_version']} {job['method']} {status}{drafter}, {max(moments):%Y-%m-%d %H:%M} UTC{why}"


def _deployment_line(deployment: dict[str, Any]) -> str:
    style = STATE_STYLES.get(deployment["state"], "")
    state = f"[{style}]{deployment['state']}[/]" if style else deployment["state"]
    if deployment["drafter_version"] is None:
        served = f"t{deployment['target_version']}, speculation off"
    else:
        served = f"t{deployment['target_version']} + d{deployment['drafter_version']}, gamma {deployment['gamma']}"
    acceptance = "-" if deployment["acceptance_7d"] is None else f"{deployment['acceptance_7d']:.2f}"
    return f"{state}: {served}; acceptance 7d {acceptance}"


LEGEND = (
    "v3 <- t2: drafter version 3, trained for target version 2. t2 + d3: target v2 served with drafter v3. "
    "gamma rec: the range (and start) the decision framework recommends, none when it advises no speculation; "
    "meas: the gamma validation measured best. acceptance 7d: accepted / drafted tokens over the last 7 days."
)


def status_table(status: dict[str, Any]) -> Group:
    """One block per target: its versions and aliases, its drafters, each deployment serving it, its last sync;
    labels on the left, values that wrap at any terminal width, and the legend of the short forms."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    blocks: list[Any] = [Text("draftsync status", style="bold")]
    for target in status["targets"]:
        grid = Table.grid(padding=(0, 2))
        grid.add_column(no_wrap=True, style="dim")
        grid.add_column(overflow="fold")
        grid.add_row("drafters", _drafter_lines(target["drafters"]))
        for deployment in target["deployments"]:
            grid.add_row(escape(deployment["name"]), _deployment_line(deployment))
        if not target["deployments"]:
            grid.add_row("deployment", "[dim]not deployed[/]")
        grid.add_row("last sync", _sync_cell(target["last_sync"]))
        if target["last_attempt"] is not None:
            grid.add_row("last attempt", _sync_cell(target["last_attempt"]))
        blocks += [Text(""), _target_heading(target), grid]
    for problem in status.get("problems", []):
        blocks += [Text(""), Text(f"problem: {problem}", style="yellow")]
    blocks += [Text(""), Text(LEGEND, style="dim")]
    return Group(*blocks)
